"""The lab's fault history (inventories/lab/faults.yml) audited after real `collect.yml` sweeps: every
fault the lab injects is warned of by a rule finding of its layer on its node and device, except the
MTU mismatch, whose only rule compares the node with the fleet (the audit replays the node alone, as
its fault window holds only the node: docs/audit.md); with the model too, nothing the rules warned of
is lost, and what more is warned of is warned by a model finding. The lab injects
its faults from the first sweep, so no lead can exceed the minute its sweeps span: every kind's median
lead is 0, under the default 30-minute target (exit 1), and meets a target of 0 (exit 0)."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from conftest import TOP, swept_lab

FAULTS = TOP / "inventories/lab/faults.yml"


def test_every_lab_fault_is_warned_of_on_its_node_and_device_and_leads_are_judged(tmp_path, tmp_dsn):
    env = swept_lab(tmp_path, tmp_dsn)
    cli = [sys.executable, "-m", "stethoscope.cli"]
    audit = [*cli, "audit", "--faults", str(FAULTS), "--json", "--no-model"]
    judged = subprocess.run(audit, env=env, cwd=TOP, capture_output=True, text=True, check=False)
    assert judged.returncode == 1, judged.stderr
    result = json.loads(judged.stdout)
    injected = yaml.safe_load(FAULTS.read_text())["faults"]
    assert len(result["faults"]) == len(injected)
    for fault in result["faults"]:
        assert fault["source"] == "metrics"
        if fault["kind"] == "mtu_mismatch":
            assert fault["outcome"] == "missed", fault
            continue
        assert fault["outcome"] == "warned", fault
        assert fault["lead_minutes"] == 0
    assert {k["kind"] for k in result["kinds"]} == {f["kind"] for f in injected}
    assert all(k["under_target"] and k["median_lead_minutes"] == 0 for k in result["kinds"])
    again = subprocess.run([*audit, "--lead-target", "0m"], env=env, cwd=TOP, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert len(json.loads(again.stdout)["faults"]) == len(injected)  # re-imported: the same faults
    whole = subprocess.run(audit[:-1], env=env, cwd=TOP, capture_output=True, text=True, check=False)
    assert whole.returncode == 1, whole.stderr
    by_rules = {f["fault_id"]: f for f in result["faults"]}
    for fault in json.loads(whole.stdout)["faults"]:
        before = by_rules[fault["fault_id"]]
        if before["outcome"] == "warned":
            assert fault["outcome"] == "warned" and fault["lead_minutes"] >= before["lead_minutes"], fault
        elif fault["outcome"] == "warned":
            assert fault["rule_id"].startswith("model."), fault
