"""Independent findings act in parallel (4 at once by default), each finding's steps in order; the
actions table holds each step's start (recorded before it runs) and end."""

from __future__ import annotations

import os

from test_execute import db, diagnose, execute_args, rules, table, worn

from stethoscope.store.client import Store

__all__ = ["db"]
NODES = ("node01", "node02", "node03", "node04")


def test_four_findings_playbooks_overlap_and_each_findings_steps_stay_in_order(tmp_path, db, slurm):
    with Store(db) as store:
        for node in NODES:
            worn(store, node)
    actions = [
        {"type": "playbook", "playbook": "remediate/drain.yml"},
        {"type": "log", "message": "{{ node_id }} drained"},
    ]
    settings = execute_args(tmp_path, "stethoscope_breaker_fraction=0.5")  # 4 of 8 may go
    env = {**os.environ, **slurm.env}
    findings, _ = diagnose(tmp_path, db, rules(tmp_path, actions), *settings, env=env)
    why = table(db, "SELECT target, action, status, detail FROM DB.actions FINAL")  # said if it fails
    assert {f["outcome"] for f in findings} == {"playbook:remediate/drain.yml ok, log ok"}, why
    assert all("DRAIN" in slurm.node(node)["state"] for node in NODES)
    rows = table(
        db,
        "SELECT target, action, toUnixTimestamp64Milli(started_at), toUnixTimestamp64Milli(finished_at) "
        "FROM DB.actions FINAL",
    )
    steps = {(target, action.split(":")[0]): (start, end) for target, action, start, end in rows}
    playbooks = [steps[(node, "playbook")] for node in NODES]
    assert max(start for start, _ in playbooks) < min(end for _, end in playbooks)  # all four at once
    assert all(steps[(node, "playbook")][1] <= steps[(node, "log")][0] for node in NODES)
