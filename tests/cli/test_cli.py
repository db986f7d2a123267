"""The stethoscope command: exit codes, messages naming file and line, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from stethoscope.cli.main import main

from conftest import LAB_INVENTORY, TOP, hot_gpu


def cli(*args, env_extra=None, cwd=TOP):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
    )


def test_db_init_and_ingest(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    good = {
        "node_id": "n1",
        "metric_name": "gpu_temperature_celsius",
        "device": "gpu0",
        "labels": {},
        "value": 41,
        "timestamp": "2026-11-30T00:00:00Z",
    }
    lines = [
        json.dumps(good),
        json.dumps({**good, "metric_name": "gpu_made_up"}),
        "{not json",
        json.dumps({**good, "timestamp": 1764460860, "value": 42}),
    ]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    spool = str(tmp_path / "spool")
    assert cli("--dsn", dsn, "--spool-dir", spool, "db", "init").returncode == 0
    result = cli("--dsn", dsn, "--spool-dir", spool, "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 2
    assert "rows.ndjson:2: unknown metric 'gpu_made_up'" in result.stderr
    assert "rows.ndjson:3: not JSON" in result.stderr
    assert "stored 2 rows" in result.stdout and "Traceback" not in result.stderr
    summary = cli("--dsn", dsn, "summary")
    assert summary.returncode == 0 and "n1" in summary.stdout


def test_ingest_with_the_database_down_spools_without_leaking_the_password(tmp_path):
    (tmp_path / "rows.ndjson").write_text(
        json.dumps(
            {
                "node_id": "n1",
                "metric_name": "net_mtu",
                "device": "ib0",
                "value": 4096,
                "timestamp": 1764460800,
            }
        )
        + "\n"
    )
    result = cli(
        "--spool-dir",
        str(tmp_path / "spool"),
        "ingest",
        str(tmp_path / "rows.ndjson"),
        env_extra={"STETHOSCOPE_DSN": "http://admin:hunter2@127.0.0.1:9/x"},
    )
    assert result.returncode == 0, result.stderr
    assert "1 rows spooled" in result.stderr and "hunter2" not in result.stderr + result.stdout
    status = cli("--spool-dir", str(tmp_path / "spool"), "spool", "status")
    assert status.stdout.startswith("1 rows waiting")


def test_missing_file_and_bad_dsn_are_usage_errors(tmp_path):
    assert cli("ingest", str(tmp_path / "nope.ndjson")).returncode == 2
    bad = cli("--dsn", "ftp://x", "db", "init")
    assert bad.returncode == 2 and "unsupported DSN scheme" in bad.stderr


def test_cluster_ddl_printed():
    result = cli("db", "ddl", "--cluster", "gpu")
    assert result.returncode == 0 and "ON CLUSTER 'gpu'" in result.stdout


HOT_RULE = """
- rule_id: hot
  description: hot GPU (test)
  severity: critical
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m}
"""


def _rule_path(tmp_path, case):
    folder = tmp_path / "rules"
    folder.mkdir()
    if case == "broken":  # a critical rule whose operator does not parse, next to one that loads
        (folder / "hot.yml").write_text(HOT_RULE.replace('operator: ">"', 'operator: "~"'))
        (folder / "ok.yml").write_text(HOT_RULE.replace("rule_id: hot", "rule_id: warm").replace("80", "99"))
    elif case == "missing":
        return folder / "nope"
    return folder  # "empty": a folder without a rule file


def test_rules_check_on_a_folder_without_rules_is_a_config_error(tmp_path):
    (tmp_path / "rules").mkdir()
    result = cli("rules", "check", str(tmp_path / "rules"))
    assert result.returncode == 2 and "no rules under" in result.stderr


@pytest.mark.parametrize("command", ["diagnose", "watch"])
@pytest.mark.parametrize("case", ["broken", "missing", "empty"])
def test_rules_that_do_not_load_are_a_config_error_not_healthy(tmp_path, tmp_dsn, command, case):
    hot_gpu(tmp_dsn)
    path = _rule_path(tmp_path, case)
    extra = ["--fail-on", "critical"] if command == "diagnose" else ["--interval", "0.1", "--cycles", "1"]
    result = cli("--dsn", tmp_dsn, command, "--rules", str(path), *extra)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "healthy" not in result.stdout and "Traceback" not in result.stderr
    expected = {"broken": f"{path / 'hot.yml'}:6: operator", "missing": "no such file", "empty": "no rules"}
    assert expected[case] in result.stderr


def test_an_internal_error_is_exit_3_in_one_line(tmp_path):
    inject = (
        "import sys, stethoscope.cli.main as m\n"
        "def boom(args): raise RuntimeError('injected')\n"
        "m._run = boom\n"
        "sys.exit(m.main(sys.argv[1:]))\n"
    )
    run = [sys.executable, "-c", inject, "spool", "status"]
    plain = subprocess.run(run, capture_output=True, text=True, cwd=TOP, check=False)
    assert plain.returncode == 3 and plain.stdout == ""
    assert plain.stderr.count("\n") == 1 and "internal error: RuntimeError: injected" in plain.stderr
    debug = subprocess.run([*run, "--debug"], capture_output=True, text=True, cwd=TOP, check=False)
    assert debug.returncode == 3 and "Traceback" in debug.stderr
    env = {**os.environ, "STETHOSCOPE_DEBUG": "1"}
    by_env = subprocess.run(run, capture_output=True, text=True, cwd=TOP, env=env, check=False)
    assert by_env.returncode == 3 and "Traceback" in by_env.stderr


def test_global_options_after_the_subcommand(tmp_path, tmp_dsn):
    before = cli("--dsn", tmp_dsn, "--database", "after", "db", "init")
    assert before.returncode == 0, before.stderr
    after = cli("db", "init", "--dsn", tmp_dsn, "--database", "after", "--spool-dir", str(tmp_path / "s"))
    assert after.returncode == 0 and "(database after)" in after.stdout, after.stderr
    # a value before the subcommand is not overwritten by the subcommand's own (absent) default
    mixed = cli("--database", "mixed", "db", "ddl")
    assert "CREATE DATABASE IF NOT EXISTS mixed" in mixed.stdout
    assert "CREATE DATABASE IF NOT EXISTS late" in cli("db", "ddl", "--database", "late").stdout
    status = cli("spool", "status", "--spool-dir", str(tmp_path / "s"))
    assert status.returncode == 0 and str(tmp_path / "s") in status.stdout


def test_summary_on_an_uninitialised_database_says_run_db_init(tmp_dsn):
    result = cli("summary", "--dsn", tmp_dsn)
    assert result.returncode == 2 and "stethoscope db init" in result.stderr
    assert "Traceback" not in result.stderr and "UNKNOWN_DATABASE" not in result.stderr


def test_diagnose_on_an_uninitialised_database_is_a_configuration_error_saying_run_db_init(tmp_dsn):
    """Regression guard (a fresh-clone run): `diagnose` on a database that was never created ended
    in ClickHouse's UNKNOWN_DATABASE and exit 3 (a failed run), where `summary` says what to do."""
    result = cli("diagnose", "--dsn", tmp_dsn, "--no-model")
    assert result.returncode == 2, result.stderr
    assert "stethoscope db init" in result.stderr and "Traceback" not in result.stderr


def test_verify_refuses_a_node_that_is_not_a_valid_host_of_the_inventory(tmp_path, tmp_dsn):
    cli("--dsn", tmp_dsn, "db", "init")
    lab = ("--inventory", str(LAB_INVENTORY))
    for node in ("node;rm -rf /", "-oProxyCommand=sh"):  # refused by the one validator
        result = cli("verify", "--dsn", tmp_dsn, f"--node={node}", "--txn", "t1", *lab)
        assert result.returncode == 2 and "is not a valid host of" in result.stderr, result.stderr
        assert result.stdout == ""
    unnamed = cli("verify", "--dsn", tmp_dsn, "--node", "node01", "--txn", "t1")  # no lab by default
    assert unnamed.returncode == 2 and "needs an inventory" in unnamed.stderr, unnamed.stderr
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01: {}\n")
    for env in ({}, {"STETHOSCOPE_INVENTORY": str(inventory)}):
        args = () if env else ("--inventory", str(inventory))
        other = cli("verify", "--dsn", tmp_dsn, "--node", "node01", "--txn", "t1", *args, env_extra=env)
        assert other.returncode == 2 and str(inventory) in other.stderr  # a lab node, not a host of this one
    ours = cli("verify", "--dsn", tmp_dsn, "--node", "node01", "--txn", "t1", *lab)
    assert ours.returncode == 1 and json.loads(ours.stdout)["drain_recorded"] is False  # no drain under t1


def test_watch_with_another_inventory_does_not_evaluate_the_lab_nodes(tmp_path, tmp_dsn):
    hot_gpu(tmp_dsn)  # node01 (a lab name) is hot
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "hot.yml").write_text(HOT_RULE)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01: {}\n")
    run = [
        "--dsn",
        tmp_dsn,
        "watch",
        "--rules",
        str(tmp_path / "rules"),
        "--interval",
        "0.1",
        "--cycles",
        "1",
    ]
    assert "1 findings from 1 rules" in cli(*run).stdout  # no inventory given: every stored node
    other = cli(*run, env_extra={"STETHOSCOPE_INVENTORY": str(inventory)})
    assert other.returncode == 0 and "node01" not in other.stdout, other.stderr
    # nothing of gpu01 in this store: UNKNOWN for it, never "healthy"
    assert "UNKNOWN fleet: no data from any of the 1 nodes of the inventory" in other.stdout


def metric_row(**changes):
    row = {
        "node_id": "n1",
        "metric_name": "gpu_temperature_celsius",
        "device": "gpu0",
        "labels": {},
        "value": 41,
        "timestamp": time.time() - 60,
    }
    return json.dumps({**row, **changes})


def test_bad_dsn_scheme_or_option_is_exit_2_and_nothing_spooled(tmp_path):
    (tmp_path / "rows.ndjson").write_text(metric_row() + "\n")
    spool = tmp_path / "spool"
    for dsn in ("ftp://x", "http://127.0.0.1:9/x?bogus_opt=1&password=hunter2"):
        result = cli("--dsn", dsn, "--spool-dir", str(spool), "ingest", str(tmp_path / "rows.ndjson"))
        assert result.returncode == 2, result.stderr
        assert "hunter2" not in result.stderr and "Traceback" not in result.stderr
        assert not spool.exists() or not any(spool.rglob("*.ndjson"))


def test_store_unreachable_is_exit_3_not_findings(tmp_path):
    result = cli("--dsn", "http://admin:hunter2@127.0.0.1:9/x", "summary")
    assert result.returncode == 3 and "hunter2" not in result.stderr and "Traceback" not in result.stderr


def test_db_init_ttl_days_below_1_is_exit_2(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    for days in ("-1", "0"):
        result = cli("--dsn", dsn, "db", "init", "--ttl-days", days)
        assert result.returncode == 2 and "--ttl-days" in result.stderr and "at least 1" in result.stderr
    assert not (tmp_path / "db").exists()


def test_ttl_days_on_an_existing_database_alters_the_ttl(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    assert cli("--dsn", dsn, "db", "init").returncode == 0
    changed = cli("--dsn", dsn, "db", "init", "--ttl-days", "7")
    assert changed.returncode == 0 and "raw TTL changed from 30 to 7 days (metrics, facts)" in changed.stdout
    from stethoscope.store.client import Store

    with Store(dsn) as store:
        for table in ("metrics", "facts"):
            assert "toIntervalDay(7)" in store.query(f"SHOW CREATE TABLE stethoscope.{table}")[0][0]
    again = cli("--dsn", dsn, "db", "init")
    assert "raw TTL 7 days (unchanged)" in again.stdout


def test_ingest_dash_reads_stdin(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "stethoscope.cli",
            "--dsn",
            dsn,
            "--spool-dir",
            str(tmp_path / "s"),
            "ingest",
            "-",
        ],
        input=metric_row() + "\n" + metric_row(value=42, timestamp=time.time() - 30) + "\n{bad\n",
        capture_output=True,
        text=True,
        cwd=TOP,
        check=False,
    )
    assert result.returncode == 2 and "stored 2 rows" in result.stdout
    assert "<stdin>:3: not JSON" in result.stderr


def test_ingest_rejects_future_timestamps_and_warns_about_rows_past_the_ttl(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    lines = [
        metric_row(),
        metric_row(timestamp=time.time() + 3600),
        metric_row(timestamp=time.time() + 7200),
        metric_row(timestamp=time.time() - 40 * 86400),
    ]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    assert cli("--dsn", dsn, "db", "init").returncode == 0
    result = cli("--dsn", dsn, "--spool-dir", str(tmp_path / "s"), "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 2
    assert "2 rows rejected: timestamp more than 5 min in the future (first at " in result.stderr
    assert "rows.ndjson:2)" in result.stderr
    assert "1 rows are older than the raw TTL (30 days)" in result.stderr
    assert "stored 2 rows" in result.stdout


def bad_spool(spool_dir, dsn):
    """A spool file for `dsn` whose one row no replay can store (it lacks its device column), as
    written on disk: a header naming the target, then the rows."""
    row = json.loads(metric_row())
    del row["device"]
    row["timestamp"] = int(row["timestamp"] * 1000)
    header = {"__spool__": {"dsn": dsn, "database": "stethoscope", "table": "metrics"}}  # dsn: chdb:///abs
    spool_dir.mkdir(parents=True, exist_ok=True)
    path = spool_dir / f"metrics-{int(time.time() * 1000)}-{os.getpid()}-0.ndjson"
    path.write_text(json.dumps(header) + "\n" + json.dumps(row) + "\n")
    return path


def test_spool_status_lists_target_rows_attempts_and_quarantine(tmp_path):
    """A file the store refuses as a whole (here: its table was dropped) is retried, then quarantined;
    `spool status` shows both stages."""
    from stethoscope.store.client import Store

    dsn, spool = f"chdb://{tmp_path / 'db'}", str(tmp_path / "spool")
    assert cli("--dsn", dsn, "--spool-dir", spool, "db", "init").returncode == 0
    with Store(dsn) as store:
        store.command("DROP TABLE stethoscope.nodes")
    header = {"__spool__": {"dsn": dsn, "database": "stethoscope", "table": "nodes"}}
    row = {"node_id": "n1", "slurm_name": "n1", "rack": "", "switch": "", "groups": [], "updated_at": 1}
    bad = tmp_path / "spool" / f"nodes-{int(time.time() * 1000)}-{os.getpid()}-0.ndjson"
    bad.write_text(json.dumps(header) + "\n" + json.dumps(row) + "\n")
    status = cli("--spool-dir", spool, "spool", "status")
    assert status.stdout.startswith("1 rows waiting") and f"{bad.name}  nodes  1 rows" in status.stdout
    assert (
        f"-> chdb://{tmp_path / 'db'} database stethoscope" in status.stdout and "0 attempts" in status.stdout
    )
    assert cli("--dsn", dsn, "--spool-dir", spool, "spool", "replay").returncode == 0
    status = cli("--spool-dir", spool, "spool", "status")
    assert "1 failed attempts (" in status.stdout and "db init" in status.stdout
    for _ in range(2):
        assert cli("--dsn", dsn, "--spool-dir", spool, "spool", "replay").returncode == 0
    status = cli("--spool-dir", spool, "spool", "status")
    assert status.stdout.startswith("0 rows waiting") and "1 files in quarantine" in status.stdout
    assert f"{bad.name}: failed 3 replays into chdb://" in status.stdout
    assert (tmp_path / "spool/quarantine" / bad.name).exists()


def test_spool_replay_into_moves_rows_meant_for_another_database(tmp_path):
    (tmp_path / "rows.ndjson").write_text(metric_row() + "\n" + metric_row(value=43) + "\n")
    spool = str(tmp_path / "spool")
    down = cli(
        "--dsn", "http://127.0.0.1:9/prod", "--spool-dir", spool, "ingest", str(tmp_path / "rows.ndjson")
    )
    assert "2 rows spooled" in down.stderr
    dsn = f"chdb://{tmp_path / 'db'}"
    plain = cli("--dsn", dsn, "--spool-dir", spool, "spool", "replay")
    assert (
        "replayed 0 spooled rows" in plain.stdout and "1 spool files are for another database" in plain.stdout
    )
    moved = cli("--spool-dir", spool, "spool", "replay", "--into", dsn)
    assert moved.returncode == 0 and "replayed 2 spooled rows from 1 files" in moved.stdout
    assert cli("--spool-dir", spool, "spool", "status").stdout.startswith("0 rows waiting")


def test_diagnose_execute_with_a_bad_spool_still_evaluates_and_acts(tmp_path):
    from test_execute import execute_args, rules, worn

    from stethoscope.store.client import Store

    dsn = f"chdb://{tmp_path / 'db'}"
    with Store(dsn) as store:
        store.init_schema()
        worn(store, "node03", at=int(time.time() * 1000) - 5000)
    log_rules = rules(tmp_path, [{"type": "log", "message": "{{ node_id }} worn"}])
    settings = execute_args(tmp_path)
    bad_spool(tmp_path / "spool", dsn)
    (tmp_path / "not-a-folder").write_text("x")
    for spool in [tmp_path / "spool"] * 4 + [tmp_path / "not-a-folder"]:
        options = ["--dsn", dsn, "--spool-dir", str(spool)]
        result = cli(*options, "diagnose", "--json", "--rules", str(log_rules), *settings)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        (finding,) = json.loads(result.stdout)
        assert finding["rule_id"] == "worn_ssd"
    assert (tmp_path / "findings.log").read_text().count("node03 worn") == 1  # acted once, then cooldown
    assert len(list((tmp_path / "spool/rejected").glob("*.ndjson"))) == 1  # the bad row, set aside alone


def test_a_file_as_embedded_database_is_exit_2_saying_not_a_database(tmp_path):
    (tmp_path / "db").write_text("x")
    result = cli("--dsn", f"chdb://{tmp_path / 'db'}", "summary")
    assert result.returncode == 2 and "not a database: it is a file" in result.stderr
    assert "in use" not in result.stderr and "Traceback" not in result.stderr


def test_db_ddl_names_the_database_of_stethoscope_database_like_every_other_command(monkeypatch, capsys):
    monkeypatch.setenv("STETHOSCOPE_DATABASE", "fromenv")
    assert main(["db", "ddl"]) == 0
    assert "CREATE DATABASE IF NOT EXISTS fromenv" in capsys.readouterr().out
    assert main(["db", "ddl", "--database", "given"]) == 0
    assert "CREATE DATABASE IF NOT EXISTS given" in capsys.readouterr().out
