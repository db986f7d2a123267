"""The circuit breaker against a real slurmctld, 8 nodes, so each limit is 1 unless a test raises it:
it counts drains under way, stethoscope's drains of earlier hours not yet resumed, and nodes Slurm
shows DRAIN or DOWN (a human's included); new isolations count within a sliding 60-minute window; an
in-flight drain whose executor died expires after its timeout, checked against Slurm."""

from __future__ import annotations

import json
import os

from test_execute import db, diagnose, execute_args, rules, table, worn

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
    assert "1 of 8 nodes isolated now (node01" in refusal(db)


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


def test_the_breaker_counts_nodes_slurm_shows_drained_or_down_by_a_human(tmp_path, db, slurm):
    assert slurm.scontrol("update", "NodeName=node05", "State=DOWN", "Reason=psu swap").returncode == 0
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} refused" and "node05" in refusal(db)
    slurm.undrain_all()
    assert slurm.scontrol("update", "NodeName=node06", "State=DRAIN", "Reason=bios update").returncode == 0
    with Store(db) as store:
        store.command(f"TRUNCATE TABLE {store.database}.findings")
    finding = drain_node02(tmp_path, db, slurm)
    assert finding["outcome"] == f"{DRAIN} refused" and "node06" in refusal(db)


def test_new_isolations_count_within_a_sliding_hour(tmp_path, db, slurm):
    with Store(db) as store:  # drained 50 min ago and resumed since: not out, but within the window
        drain_row(store, "node01", "ok", now_ms() - 50 * MINUTE)
        resume_row(store, "node01", now_ms() - 20 * MINUTE)
    finding = drain_node02(tmp_path, db, slurm, "stethoscope_breaker_isolated_fraction=0.5")
    assert finding["outcome"] == f"{DRAIN} refused" and "newly isolated within 3600 s" in refusal(db)
    with Store(db) as store:  # the same 70 minutes ago: out of the window
        store.command(f"TRUNCATE TABLE {store.database}.actions")
        store.command(f"TRUNCATE TABLE {store.database}.findings")
        drain_row(store, "node01", "ok", now_ms() - 70 * MINUTE)
        resume_row(store, "node01", now_ms() - 20 * MINUTE)
    finding = drain_node02(tmp_path, db, slurm, "stethoscope_breaker_isolated_fraction=0.5")
    assert finding["outcome"] == f"{DRAIN} ok"
