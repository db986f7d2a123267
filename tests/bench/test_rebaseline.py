"""A hardware change triggers a baseline: collect.yml fingerprints every node each sweep, the lab's
node02 gets a newer driver at its second sweep, `node_fingerprint_changes_total` counts it (0 at a
node's first reading), the shipped rule finds it, and the plan groups changed nodes per class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stethoscope.bench.plan import changed_nodes_by_class
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, ansible_env

BIN = Path(sys.executable).parent


def test_driver_upgrade_between_sweeps_is_one_rebaseline_finding(tmp_path, tmp_dsn):
    inventory = tmp_path / "inv/hosts.yml"
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"))
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "3", "--inventory", str(inventory)],
        env=env,
        check=True,
        capture_output=True,
    )
    for _sweep in range(3):  # the driver changes at the second, once
        proc = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), str(TOP / "playbooks/collect.yml")],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:]
    with Store(tmp_dsn) as store:
        series = store.query(
            "SELECT node_id, groupArray(value) FROM (SELECT node_id, value FROM stethoscope.metrics "
            "WHERE metric_name = 'node_fingerprint_changes_total' ORDER BY timestamp) GROUP BY node_id "
            "ORDER BY node_id"
        )
        plans = changed_nodes_by_class(store, now_ms() - 3600_000)
    assert series == [("node01", [0.0, 0.0, 0.0]), ("node02", [0.0, 1.0, 1.0]), ("node03", [0.0, 0.0, 0.0])]
    assert [p.nodes for p in plans] == [["node02"]]
    diagnose = subprocess.run(
        [str(BIN / "stethoscope"), "diagnose", "--json"], env=env, cwd=TOP, capture_output=True, text=True
    )
    found = [f for f in json.loads(diagnose.stdout) if f["rule_id"] == "hardware_changed_rebaseline"]
    assert [(f["node_id"], f["device"]) for f in found] == [("node02", "node")]


def test_a_fleet_wide_upgrade_is_one_plan_per_class(store):
    start = now_ms() - 600_000
    metrics, facts = MetricColumns(), []
    for i, (node, cls) in enumerate([("n1", "a"), ("n2", "a"), ("n3", "a"), ("n4", "b"), ("n5", "b")]):
        changed = node != "n5"  # n5 kept its driver
        for step, value in enumerate([0.0, 1.0 if changed else 0.0]):  # first reading 0, as collected
            metrics.append(
                node, "node_fingerprint_changes_total", "node", {}, value, start + step * 60_000 + i
            )
        facts.append(
            {
                "node_id": node,
                "collector": "fingerprint",
                "run_id": "r",
                "collected_at": start + 60_000,
                "facts": json.dumps({"class_fingerprint": cls}),
            }
        )
    store.insert_metrics(metrics)
    store.insert_rows("facts", facts)
    plans = changed_nodes_by_class(store, start - 1)
    assert [(p.class_fingerprint, p.nodes) for p in plans] == [("a", ["n1", "n2", "n3"]), ("b", ["n4"])]
    assert plans[0].command == "ansible-playbook -i INVENTORY playbooks/baseline.yml --limit n1,n2,n3"
