"""`stethoscope summary` on the lab: its unhealthy values are the findings `diagnose` gives (one
reading of the rules), not a second heuristic of its own."""

from __future__ import annotations

import json
import subprocess
import sys

from stethoscope.timeutil import now_ms

from conftest import TOP, swept_lab


def test_summary_lists_exactly_the_findings_diagnose_gives_on_the_lab(tmp_path, tmp_dsn):
    env = swept_lab(tmp_path, tmp_dsn)
    cli = [sys.executable, "-m", "stethoscope.cli"]
    at = str(now_ms() / 1000)
    diagnosed = subprocess.run(
        [*cli, "diagnose", "--json", "--at", at],
        env=env,
        cwd=TOP,
        capture_output=True,
        text=True,
        check=False,
    )
    assert diagnosed.returncode in (0, 1), diagnosed.stderr
    findings = json.loads(diagnosed.stdout)
    summary = subprocess.run([*cli, "summary", "--at", at], env=env, cwd=TOP, capture_output=True, text=True)
    assert summary.returncode == 0, summary.stderr
    listed = [
        line.split(None, 5)[5] if line.startswith("node") else line.strip()
        for line in summary.stdout.splitlines()[1:]
    ]
    expected = []
    for finding in findings:
        nodes = json.loads(finding["evidence"]).get("nodes") or [finding["node_id"]]
        expected += [f"{finding['rule_id']} ({finding['severity']}): {finding['message']}"] * len(nodes)
    assert findings and sorted(line for line in listed if line != "-") == sorted(expected)
    # node02's link_downed stopped at the 8-bit maximum: a finding of the saturated-counter rule, and
    # nothing else speaks of it (the old summary listed `ib_link_downed_total = 255` on its own)
    saturated = [f for f in findings if f["rule_id"] == "ib_counter_saturated"]
    assert "node02" in {f["node_id"] for f in saturated}
    assert "ib_link_downed_total" in next(f["message"] for f in saturated if f["node_id"] == "node02")
    assert "= 255" not in summary.stdout
