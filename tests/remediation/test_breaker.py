"""The circuit breaker against a real slurmctld, 8 nodes, so its own limit is 1 unless a test raises
it: stethoscope's isolations (drains under way, its drains of earlier hours not yet resumed) ≤ 1; all
nodes out of service, with those Slurm shows DRAIN or DOWN for others (a human's), ≤ 2; new
isolations within a sliding 60-minute window ≤ 1; an in-flight drain whose executor died expires
after its timeout, checked against Slurm. A 16-node cluster with one human drain still isolates."""

from __future__ import annotations

import json
import os

from test_execute import AT, NODES, db, diagnose, execute_args, rules, table, worn

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

__all__ = ["db"]
DRAIN = "playbook:remediate/drain.yml"
MINUTE = 60_000


def drain_row(store, node, status, started_ms, txn="0ldtxn000001"):
    row = {
        "txn_id": txn,
        "finding_id": f"f-{node}",
        "action": DRAIN,
        "target": node,
        "status": status,
        "detail": "{}",
        "started_at": started_ms,
        "finished_at": None if status == "in_flight" else started_ms + 5_000,
        "version": started_ms,
    }
    store.insert_rows("actions", [row])


def resume_row(store, node, at_ms, txn="0ldtxn000001"):
    row = {
        "txn_id": txn,
        "finding_id": "",
        "action": "resume",
        "target": node,
        "status": "ok",
        "detail": "{}",
        "started_at": at_ms,
        "finished_at": at_ms,
        "version": at_ms,
    }
    store.insert_rows("actions", [row])


def drain_node02(tmp_path, db, slurm, *settings):
    with Store(db) as store:
        worn(store, "node02")
    env = {**os.environ, **slurm.env}
    rule_dir = rules(tmp_path, [{"type": "playbook", "playbook": "remediate/drain.yml"}])
    (finding,), _ = diagnose(tmp_path, db, rule_dir, *execute_args(tmp_path, *settings), env=env)
    return finding


def refusal(db):
    rows = table(
        db,
        "SELECT argMax(detail, version) FROM DB.actions WHERE target = 'node02' "
        "GROUP BY txn_id, action, target HAVING argMax(status, version) = 'refused' "
        "ORDER BY max(version) DESC LIMIT 1",  # the latest refusal
    )
    return json.loads(rows[0][0])["reason"] if rows else ""


def test_the_breaker_counts_a_drain_from_earlier_hours_not_yet_resumed(tmp_path, db, slurm):
    with Store(db) as store:
        drain_row(store, "node01", "ok", now_ms() - 5 * 3600_000)
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} refused" and "DRAIN" not in slurm.node("node02")["state"]
    assert "own limit: 1 of 8 nodes isolated now by stethoscope (node01)" in refusal(db)


def test_the_breaker_lets_a_drain_through_once_the_earlier_one_is_resumed(tmp_path, db, slurm):
    with Store(db) as store:
        drain_row(store, "node01", "ok", now_ms() - 5 * 3600_000)
        resume_row(store, "node01", now_ms() - 4 * 3600_000)
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} ok" and "DRAIN" in slurm.node("node02")["state"]


def test_the_breaker_counts_a_drain_in_flight(tmp_path, db, slurm):
    with Store(db) as store:
        drain_row(store, "node01", "in_flight", now_ms() - MINUTE)
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} refused"


def test_an_in_flight_drain_whose_executor_died_expires_after_its_timeout(tmp_path, db, slurm):
    with Store(db) as store:
        drain_row(store, "node01", "in_flight", now_ms() - 40 * MINUTE)  # the timeout is 30 min
    finding = drain_node02(tmp_path, db, slurm, "stethoscope_breaker_window_fraction=0.5")
    assert finding["outcome"] == f"{DRAIN} ok"
    expired = table(
        db, f"SELECT argMax(status, version) FROM DB.actions WHERE target = 'node01' AND action = '{DRAIN}'"
    )
    assert expired == [("expired",)]


def test_one_human_drain_leaves_room_for_one_isolation_two_do_not(tmp_path, db, slurm):
    """Regression: one node a human drained used up the whole limit (10 % of 8 is 1): no automatic
    drain at all. Nodes out of service for other reasons count against a limit of their own."""
    assert slurm.scontrol("update", "NodeName=node05", "State=DOWN", "Reason=psu swap").returncode == 0
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} ok" and "DRAIN" in slurm.node("node02")["state"]
    slurm.undrain_all()
    with Store(db) as store:
        store.command(f"TRUNCATE TABLE {store.database}.findings")
        store.command(f"TRUNCATE TABLE {store.database}.actions")
    for node, state in (("node05", "DOWN"), ("node06", "DRAIN")):
        assert slurm.scontrol("update", f"NodeName={node}", f"State={state}", "Reason=bios").returncode == 0
    finding = drain_node02(tmp_path, db, slurm)
    reason = refusal(db)
    assert finding["outcome"] == f"{DRAIN} refused" and "DRAIN" not in slurm.node("node02")["state"]
    assert "out-of-service limit: 2 of 8 nodes out of service now" in reason
    assert "by others: node05, node06" in reason and "the limit is 2" in reason


def test_the_floor_of_the_own_limit_is_a_setting(tmp_path, db, slurm):
    with Store(db) as store:
        drain_row(store, "node01", "ok", now_ms() - 5 * 3600_000)
    finding = drain_node02(tmp_path, db, slurm, "stethoscope_breaker_min_isolations=2")
    assert finding["outcome"] == f"{DRAIN} ok"


def test_new_isolations_count_within_a_sliding_hour(tmp_path, db, slurm):
    with Store(db) as store:  # drained 50 min ago and resumed since: not out, but within the window
        drain_row(store, "node01", "ok", now_ms() - 50 * MINUTE)
        resume_row(store, "node01", now_ms() - 20 * MINUTE)
    finding = drain_node02(tmp_path, db, slurm, "stethoscope_breaker_isolated_fraction=0.5")
    assert finding["outcome"] == f"{DRAIN} refused"
    assert "window limit: 1 of 8 nodes newly isolated within 3600 s" in refusal(db)
    with Store(db) as store:  # the same 70 minutes ago: out of the window
        store.command(f"TRUNCATE TABLE {store.database}.actions")
        store.command(f"TRUNCATE TABLE {store.database}.findings")
        drain_row(store, "node01", "ok", now_ms() - 70 * MINUTE)
        resume_row(store, "node01", now_ms() - 20 * MINUTE)
    finding = drain_node02(tmp_path, db, slurm, "stethoscope_breaker_isolated_fraction=0.5")
    assert finding["outcome"] == f"{DRAIN} ok"


def test_a_16_node_cluster_with_one_human_drain_still_isolates_a_failing_node(tmp_path, db, slurm):
    """The issue's case: 10 % of 16 nodes is one isolation, and a human's drain took it."""
    assert slurm.scontrol("update", "NodeName=node07", "State=DRAIN", "Reason=fan swap").returncode == 0
    more = [f"node{i:02d}" for i in range(9, 17)]
    with Store(db) as store:
        worn(store, "node02")
        batch = MetricColumns()
        for node in more:  # the second half reports healthy too (silence would be UNKNOWN)
            batch.append(node, "gpu_temperature_celsius", "gpu0", {}, 40.0, AT)
        store.insert_metrics(batch)
    args = execute_args(tmp_path)
    hosts = tmp_path / "inventory" / "hosts.yml"
    hosts.write_text(hosts.read_text() + "".join(f"        {n}: {{slurm_name: {n}}}\n" for n in more))
    assert len(NODES) + len(more) == 16
    rule_dir = rules(tmp_path, [{"type": "playbook", "playbook": "remediate/drain.yml"}])
    (finding,), run = diagnose(tmp_path, db, rule_dir, *args, env={**os.environ, **slurm.env})
    assert finding["outcome"] == f"{DRAIN} ok", run.stderr
    assert "DRAIN" in slurm.node("node02")["state"] and "DRAIN" in slurm.node("node07")["state"]
    assert f"action {DRAIN} ok: node node02 rule worn_ssd" in run.stderr  # the action's log line


def test_isolating_again_a_node_the_window_already_counts_adds_no_new_isolation():
    from stethoscope.remediation.breaker import CircuitBreaker

    breaker = CircuitBreaker(16)  # 10 %: one new isolation an hour
    breaker.recent = {"node04"}  # drained within the hour, resumed since (no longer out of service)
    assert breaker.room("node04")[0]  # resumed without repair: the same node again
    allowed, why = breaker.room("node05")
    assert not allowed and "window limit" in why


def test_a_node_someone_else_drained_is_skipped_not_counted_as_stethoscopes(tmp_path, db, slurm):
    """Regression: the drain playbook leaves a person's drain as it is and reported ok: the row counted
    against stethoscope's own limit until a resume that verify never allows."""
    assert slurm.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=fan swap").returncode == 0
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} skipped"
    rows = table(
        db,
        f"SELECT argMax(status, version), argMax(detail, version) FROM DB.actions WHERE action = '{DRAIN}'",
    )
    assert rows[0][0] == "skipped" and "drained by someone else: fan swap" in json.loads(rows[0][1])["reason"]
    assert slurm.node("node02")["reason"].startswith("fan swap")  # left as the person set it


def test_one_breaker_rearmed_each_cycle_keeps_the_drains_it_permitted(store):
    """Regression: each cycle armed a new breaker from the ledger; a drain permitted in the pool whose
    row the ledger did not show yet was forgotten, and a second incident drained past a limit of 1."""
    from stethoscope.remediation.breaker import CircuitBreaker
    from stethoscope.remediation.ledger import Ledger

    breaker = CircuitBreaker(8)
    assert breaker.permit("node01")[0]  # cycle N's incident, its drain under way
    names = {f"node{i:02d}": f"node{i:02d}" for i in range(1, 9)}
    breaker.arm(Ledger(store), names, {}, now_ms(), 1_800_000)  # cycle N+1: no row of it yet
    allowed, why = breaker.permit("node02")
    assert not allowed and "own limit: 1 of 8" in why and "node01" in why
    breaker.settle("node01")  # its row is recorded: the ledger counts it from now on
    drain_row(store, "node01", "ok", now_ms())
    breaker.arm(Ledger(store), names, {}, now_ms(), 1_800_000)
    assert not breaker.permit("node02")[0]
