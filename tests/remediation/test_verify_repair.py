"""Resume only when repaired (remediation/repair.py): verify keeps a node drained while a finding of
warning or worse still matches on it, however green its benchmarks, and resumes it once repaired;
it refuses a drain that is not stethoscope's before any benchmark; verify.yml works with `--limit`
on a Slurm inventory and says what to pass when the txn is missing; a resumed node that matches its
rule again is isolated again as "resumed without repair" (critical, alerted, drained)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_execute import AT, NODES, db, diagnose, execute_args, others_report, table, worn

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, ansible_env, slurm_with_slurmd

__all__ = ["db"]  # the fixture, shared with test_execute

BIN = Path(sys.executable).parent
DRAIN = {"type": "playbook", "playbook": "remediate/drain.yml"}
STORAGE_ONLY = ("-e", '{"baseline_suites": ["storage"], "bench_storage_repetitions": 1}')


def worn_rule(tmp_path, severity="critical"):
    """worn_ssd, as tests/remediation/test_execute.py's, of the given severity; its plan drains."""
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "worn.yml").write_text(
        textwrap.dedent(f"""
        - rule_id: worn_ssd
          description: worn SSD (test)
          severity: {severity}
          level: L4
          message: "{{{{ node_id }}}} {{{{ device }}}} worn: {{{{ value | int }}}} sectors"
          trigger:
            - {{metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 5m,
               aggregate: last}}
            - {{metric: smart_media_wearout_indicator_normalized, operator: "<", threshold: 10, window: 5m,
               aggregate: last}}
          action: [{json.dumps(DRAIN)}]
        """)
    )
    return folder


def repaired(store, node, at, others=NODES):
    """The SSD replaced: no reallocated sector, full life; the rest reports too."""
    batch = MetricColumns()
    batch.append(node, "smart_reallocated_sector_ct", "sda", {}, 0.0, at)
    batch.append(node, "smart_media_wearout_indicator_normalized", "sda", {}, 97.0, at)
    for other in others:
        if other != node:
            batch.append(other, "gpu_temperature_celsius", "gpu0", {}, 40.0, at)
    store.insert_metrics(batch)


def green_benchmarks(store, node, peers=("node01", "node02", "node04")):
    """A fresh storage run of `node` and of three peers of its class, all alike: green."""
    row = {
        "suite": "storage", "metric_name": "bench_fio_randread_iops", "device": "nvme0n1", "labels": {},
        "value": 100.0, "unit": "", "class_fingerprint": "c1", "unstable": 0,
    }  # fmt: skip
    rows = [
        {**row, "run_id": f"{who}-after", "node_id": who, "node_fingerprint": who, "repetition": repetition,
         "timestamp": now_ms()}
        for who in (node, *peers)
        for repetition in (1, 2, 3)
    ]  # fmt: skip
    store.insert_rows("bench_results", rows)


def verify(dsn, inventory_path, node, txn, *extra, env=None):
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "verify", "--node", node, "--txn", txn]
    command += ["--inventory", str(inventory_path), *extra]
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, env=env, check=False)


def test_a_node_whose_rule_still_matches_stays_drained_however_green_and_a_repaired_one_resumes(
    tmp_path, db, slurm
):
    """Regression (node04 resumed with 26 uncorrectable ECC errors after green benchmarks)."""
    env = {**os.environ, **slurm.env}
    rule_dir = worn_rule(tmp_path)
    at = now_ms() - 5_000  # verify evaluates the rules now: the worn sweep is within their window
    with Store(db) as store:
        worn(store, "node03", at=at)
    (finding,), _ = diagnose(tmp_path, db, rule_dir, *execute_args(tmp_path), at=at, env=env)
    txn = finding["txn_id"]
    assert slurm.node("node03")["reason"].startswith(f"stethoscope: worn_ssd {txn}")
    with Store(db) as store:
        green_benchmarks(store, "node03")
    where = tmp_path / "inventory" / "hosts.yml"
    still = verify(db, where, "node03", txn, "--rules", str(rule_dir), env=env)
    verdict = json.loads(still.stdout)
    assert still.returncode == 1, still.stderr
    assert verdict["green"] and verdict["drain_owned"] and not verdict["resume"]
    assert [f["rule_id"] for f in verdict["still_matching"]] == ["worn_ssd"]
    assert "node03 stays drained: still matching: worn_ssd (critical sda)" in still.stderr
    with Store(db) as store:
        repaired(store, "node03", now_ms())
    fixed = verify(db, where, "node03", txn, "--rules", str(rule_dir), env=env)
    assert fixed.returncode == 0, fixed.stderr
    assert json.loads(fixed.stdout)["resume"] and json.loads(fixed.stdout)["still_matching"] == []


def test_a_drain_whose_slurm_reason_is_a_persons_is_refused(tmp_path, db, slurm):
    env = {**os.environ, **slurm.env}
    with Store(db) as store:
        worn(store, "node03", at=AT)
    (finding,), _ = diagnose(tmp_path, db, worn_rule(tmp_path), *execute_args(tmp_path), env=env)
    where = tmp_path / "inventory" / "hosts.yml"
    ours = verify(db, where, "node03", finding["txn_id"], "--check-drain", env=env)
    assert ours.returncode == 0 and json.loads(ours.stdout)["drain_owned"], ours.stderr
    slurm.scontrol("update", "NodeName=node03", "Reason=RMA by alice")  # a person took it over
    theirs = verify(db, where, "node03", finding["txn_id"], "--check-drain", env=env)
    assert theirs.returncode == 1 and not json.loads(theirs.stdout)["drain_owned"]
    assert "reason 'RMA by alice" in theirs.stderr and "not stethoscope's" in theirs.stderr
    assert "whoever drained it resumes it" in theirs.stderr


def test_a_node_resumed_without_repair_is_drained_again_as_a_critical_escalation_and_alerted(
    tmp_path, db, slurm, http_standin
):
    hook = http_standin()
    env = {**os.environ, **slurm.env}
    rule_dir = worn_rule(tmp_path, severity="warning")
    # the breaker's window (1 h) holds node03's first drain: room for a second isolation in it
    settings = execute_args(
        tmp_path, f"stethoscope_alert_webhook={hook.url}", "stethoscope_breaker_fraction=0.5"
    )
    with Store(db) as store:
        worn(store, "node03", at=AT - 600_000)
    (first,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=AT - 600_000, env=env)
    assert first["outcome"] == "playbook:remediate/drain.yml ok" and hook.requests == []
    where = tmp_path / "inventory" / "hosts.yml"
    # resumed as verify.yml does, though nothing was repaired
    slurm.scontrol("update", "NodeName=node03", "State=RESUME")
    resumed = verify(db, where, "node03", first["txn_id"], "--resumed", env=env)
    assert resumed.returncode == 0, resumed.stderr
    with Store(db) as store:
        worn(store, "node03", at=AT)
    (again,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=AT, env=env)
    txn = again["txn_id"]
    assert txn != first["txn_id"] and again["severity"] == "critical"
    assert (
        "resumed without repair" in again["outcome"] and "playbook:remediate/drain.yml ok" in again["outcome"]
    )
    assert slurm.node("node03")["reason"].startswith(f"stethoscope: worn_ssd {txn}")
    (alert,) = hook.requests
    assert "node03 resumed without repair" in alert.json()["text"] and first["txn_id"] in alert.json()["text"]
    rows = table(db, f"SELECT detail FROM DB.actions FINAL WHERE action = 'escalate' AND txn_id = '{txn}'")
    detail = json.loads(rows[0][0])
    assert (detail["reason"], detail["resumed_txn"], detail["to"]) == (
        "resumed without repair",
        first["txn_id"],
        "critical",
    )


# verify.yml on a Slurm inventory (stethoscope_scheduler: slurm), node01 the one node with a slurmd


@pytest.fixture(scope="module")
def slurm_node01(tmp_path_factory):
    with slurm_with_slurmd(tmp_path_factory.mktemp("slurmd"), "node01", "node[02-03]") as cluster:
        yield cluster


@pytest.fixture
def slurm_lab(tmp_path, tmp_dsn, slurm_node01):
    """A 3-node lab whose inventory names Slurm as its scheduler; its environment for the playbooks."""
    cluster = slurm_node01
    cluster.undrain_all()
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"), **cluster.env)
    where = tmp_path / "inv" / "hosts.yml"
    build = [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "3", "--inventory", str(where)]
    subprocess.run(build, env=env, check=True, capture_output=True)
    with (where.parent / "group_vars" / "all.yml").open("a") as group_vars:
        group_vars.write("stethoscope_scheduler: slurm\nbaseline_capacity_retries: 0\n")
    subprocess.run([BIN / "stethoscope", "db", "init"], env=env, check=True, capture_output=True)
    return cluster, where, env


def own_history(dsn, node, runs=2):
    """The node's one real run, copied `runs` times a day apart before it: the three runs of its own
    history that verify compares a node alone in its class with (one real run is the slow part)."""
    with Store(dsn) as store:
        db = store.database
        columns = [
            c
            for (c,) in store.query(
                "SELECT name FROM system.columns WHERE database = {d:String} AND table = 'bench_results' "
                "AND default_kind NOT IN ('MATERIALIZED', 'ALIAS')",
                {"d": db},
            )
        ]
        shifted = {
            "run_id": "concat(run_id, '-', toString(shift))",
            "timestamp": "timestamp - toIntervalDay(shift)",
        }
        store.command(
            f"INSERT INTO {db}.bench_results ({', '.join(columns)}) "
            f"SELECT {', '.join(shifted.get(c, c) for c in columns)} FROM {db}.bench_results "
            f"ARRAY JOIN range(1, {runs + 1}) AS shift WHERE node_id = {{n:String}}",
            {"n": node},
        )


def play(env, where, playbook, *extra):
    command = [str(BIN / "ansible-playbook"), "-i", str(where), str(TOP / "playbooks" / playbook), *extra]
    # three nodes, two of them without a slurmd (DOWN): the capacity check may count them all
    command += ["-e", "baseline_max_out_of_service=1.0"]
    return subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, check=False)


def test_verify_playbook_with_limit_on_a_slurm_inventory_keeps_an_unrepaired_node_and_resumes_a_repaired_one(
    tmp_path, tmp_dsn, slurm_lab
):
    """Regression: `verify.yml --limit node09` skipped its localhost play and died with
    'HostVarsVars' has no attribute 'baseline_txn_id'."""
    cluster, where, env = slurm_lab
    lab_nodes = ["node01", "node02", "node03"]
    bench = play(env, where, "baseline.yml", "--limit", "node01", *STORAGE_ONLY)
    assert bench.returncode == 0, bench.stdout[-3000:]
    own_history(tmp_dsn, "node01")
    rule_dir = worn_rule(tmp_path)
    with Store(tmp_dsn) as store:
        worn(store, "node01", at=now_ms() - 5_000)
        others_report(store, now_ms() - 5_000, besides="node01")
    command = [
        str(BIN / "stethoscope"), "diagnose", "--json", "--rules", str(rule_dir), "--execute",
        "--inventory", str(where), "--no-model", "-e", f"stethoscope_diagnose_log={tmp_path / 'log'}",
    ]  # fmt: skip
    drained = subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, check=False)
    (finding,) = [f for f in json.loads(drained.stdout) if f["rule_id"] == "worn_ssd"]
    txn = finding["txn_id"]
    assert cluster.node("node01")["reason"].startswith(f"stethoscope: worn_ssd {txn}")

    missing = play(env, where, "remediate/verify.yml", "--limit", "node01")
    assert missing.returncode != 0 and "verify.yml needs -e stethoscope_txn_id=" in missing.stdout
    assert "HostVarsVars" not in missing.stdout

    args = ("--limit", "node01", "-e", f"stethoscope_txn_id={txn}", "-e", f"verify_rules={rule_dir}")
    args += ("-e", "stethoscope_remediate_execute=true", *STORAGE_ONLY)
    still = play(env, where, "remediate/verify.yml", *args)
    assert still.returncode != 0 and "HostVarsVars" not in still.stdout
    assert "not resuming node01" in still.stdout and "still matching: worn_ssd" in still.stdout
    assert "DRAIN" in cluster.node("node01")["state"]

    with Store(tmp_dsn) as store:
        repaired(store, "node01", now_ms(), others=lab_nodes)
    fixed = play(env, where, "remediate/verify.yml", *args)
    assert fixed.returncode == 0, fixed.stdout[-3000:]
    assert "DRAIN" not in cluster.node("node01")["state"]
    resumes = table(
        tmp_dsn, f"SELECT target FROM DB.actions FINAL WHERE action = 'resume' AND txn_id = '{txn}'"
    )
    assert resumes == [("node01",)]


def test_a_human_drained_node_is_refused_before_any_benchmark(tmp_path, tmp_dsn, slurm_lab):
    cluster, where, env = slurm_lab
    cluster.scontrol("update", "NodeName=node01", "State=DRAIN", "Reason=RMA by alice")
    refused = play(env, where, "remediate/verify.yml", "--limit", "node01", "-e", "stethoscope_txn_id=abc123")
    assert refused.returncode != 0
    assert "not benchmarking node01: no drain of node01 recorded under txn abc123" in refused.stdout
    assert "reason 'RMA by alice" in refused.stdout and "not stethoscope's" in refused.stdout
    assert "baseline preflight node01" not in refused.stdout  # the benchmark never started
    assert table(tmp_dsn, "SELECT count() FROM DB.bench_results") == [(0,)]
    assert table(tmp_dsn, "SELECT count() FROM DB.actions") == [(0,)]
    assert cluster.node("node01")["reason"].startswith("RMA by alice")


def test_a_node_with_no_fresh_data_since_its_drain_stays_drained_and_resumes_once_swept_clean(
    tmp_path, db, slurm
):
    """Regression: a drained node whose sweeps stopped read "not matching" (its rule's window held no
    sample) and resumed on green benchmarks alone."""
    env = {**os.environ, **slurm.env}
    rule_dir = worn_rule(tmp_path)
    at = now_ms() - 600_000  # the last sweep, ten minutes ago: older than the rule's 5 min window
    with Store(db) as store:
        worn(store, "node03", at=at)
    (finding,), _ = diagnose(tmp_path, db, rule_dir, *execute_args(tmp_path), at=at, env=env)
    txn = finding["txn_id"]
    assert slurm.node("node03")["reason"].startswith(f"stethoscope: worn_ssd {txn}")
    with Store(db) as store:
        green_benchmarks(store, "node03")
    where = tmp_path / "inventory" / "hosts.yml"
    silent = verify(db, where, "node03", txn, "--rules", str(rule_dir), env=env)
    assert silent.returncode == 1, silent.stderr
    verdict = json.loads(silent.stdout)
    assert verdict["green"] and verdict["drain_owned"] and verdict["still_matching"] == []
    assert not verdict["resume"]
    assert verdict["no_fresh_data"] == [
        "smart_media_wearout_indicator_normalized",
        "smart_reallocated_sector_ct",
    ]
    assert (
        "no fresh data of smart_reallocated_sector_ct since the drain: sweep the node "
        "(collect.yml --limit node03) and verify again" in silent.stderr
    )
    assert "DRAIN" in slurm.node("node03")["state"]
    with Store(db) as store:
        repaired(store, "node03", now_ms())
    swept = verify(db, where, "node03", txn, "--rules", str(rule_dir), env=env)
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["resume"] and json.loads(swept.stdout)["no_fresh_data"] == []


def test_every_stethoscope_command_of_verify_playbook_runs_one_host_at_a_time():
    """Regression: `--check-drain` and the verdict ran for every host of `--limit group` at once,
    and all but one waited 30 s on the embedded database, then failed (exit 3)."""
    import yaml

    plays = yaml.safe_load((TOP / "playbooks" / "remediate" / "verify.yml").read_text())
    commands = [
        task
        for play in plays
        for task in play.get("tasks", [])
        if "ansible.builtin.command" in task and "stethoscope.cli" in json.dumps(task)
    ]
    assert len(commands) == 3
    assert [task["name"] for task in commands if task.get("throttle") != 1 and not task.get("run_once")] == []
