"""The stethoscope command: exit codes, messages naming file and line, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import TOP


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


def _hot_store(dsn):
    from stethoscope.store.batch import MetricColumns
    from stethoscope.store.client import Store
    from stethoscope.timeutil import now_ms

    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for ago in (120_000, 60_000, 1_000):
            batch.append("node01", "gpu_temperature_celsius", "gpu0", {}, 85.0, now_ms() - ago)
        store.insert_metrics(batch)


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
    _hot_store(tmp_dsn)
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


def test_verify_refuses_a_node_that_is_not_a_valid_host_of_the_inventory(tmp_path, tmp_dsn):
    cli("--dsn", tmp_dsn, "db", "init")
    for node in ("node;rm -rf /", "-oProxyCommand=sh"):  # refused by the one validator
        result = cli("verify", "--dsn", tmp_dsn, f"--node={node}", "--txn", "t1")
        assert result.returncode == 2 and "is not a valid host of" in result.stderr, result.stderr
        assert result.stdout == ""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu01: {}\n")
    for env in ({}, {"STETHOSCOPE_INVENTORY": str(inventory)}):
        args = () if env else ("--inventory", str(inventory))
        other = cli("verify", "--dsn", tmp_dsn, "--node", "node01", "--txn", "t1", *args, env_extra=env)
        assert other.returncode == 2 and str(inventory) in other.stderr  # a lab node, not a host of this one
    ours = cli("verify", "--dsn", tmp_dsn, "--node", "node01", "--txn", "t1")
    assert ours.returncode == 1 and json.loads(ours.stdout)["drain_recorded"] is False  # no drain under t1


def test_watch_with_another_inventory_does_not_evaluate_the_lab_nodes(tmp_path, tmp_dsn):
    _hot_store(tmp_dsn)  # node01 (a lab name) is hot
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
    assert other.returncode == 0 and "healthy: 1 rules, no finding" in other.stdout, other.stderr
