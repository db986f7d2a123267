"""Replay lab sweeps of one node's disks into a store, at the lab's sweep spacing, and note when each
rule first fires: how far ahead an early warning comes of its hard limit.

Each step advances the lab (tools/lab.py), runs the node's recorded `smartctl -j -a` for every disk
and turns its output into metric rows with the collector's own parser (plugins/module_utils/smartctl),
stamped one sweep apart, as the callback would store them. Used by tests/e2e/test_lab.py and
benchmarks/early_warning_lead.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import Rule
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store

TOP = Path(__file__).resolve().parent.parent
SWEEP_MS = 60_000  # the lab's sweep spacing: the catalog's 60 s


def _smart_parser():
    collections = TOP / ".collections"
    if not (collections / "ansible_collections/aicluster/stethoscope/galaxy.yml").exists():
        subprocess.run(["bash", str(TOP / "tools/link_collection.sh")], check=True, capture_output=True)
    if str(collections) not in sys.path:
        sys.path.insert(0, str(collections))
    from ansible_collections.aicluster.stethoscope.plugins.module_utils import smartctl

    return smartctl


def lab(lab_dir: Path, *args: str) -> str:
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(lab_dir)}
    command = [sys.executable, str(TOP / "tools/lab.py"), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout


def sweep_rows(lab_dir: Path, node: str, disks: list[str], ts_ms: int) -> MetricColumns:
    """What one sweep of the node's disks stores: the recorded smartctl output, parsed as a node would."""
    smartctl = _smart_parser()
    batch = MetricColumns()
    for disk in disks:
        tool = lab_dir / "nodes" / node / "bin" / "smartctl"
        out = subprocess.run(
            [str(tool), "-j", "-a", f"/dev/{disk}"], capture_output=True, text=True, check=False
        )
        parsed = smartctl.parse_smartctl_json(out.stdout)
        parsed["device"] = parsed["device"] or disk
        for row in smartctl.smart_metrics(parsed):
            batch.append(node, row["name"], row["device"], row["labels"] or {}, float(row["value"]), ts_ms)
    return batch


def first_findings(
    store: Store, lab_dir: Path, node: str, disks: list[str], rules: list[Rule], steps: int, start_ms: int
) -> dict[str, int]:
    """Sweep `steps` times; rule_id -> the first step at which it matched the node."""
    first: dict[str, int] = {}
    for step in range(steps):
        if step:
            lab(lab_dir, "advance")
        at = start_ms + step * SWEEP_MS
        store.insert_metrics(sweep_rows(lab_dir, node, disks, at))
        for rule in rules:
            if rule.rule_id not in first and any(m.node_id == node for m in evaluate(store, rule, at)):
                first[rule.rule_id] = step
    return first
