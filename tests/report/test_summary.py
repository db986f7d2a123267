"""`stethoscope summary` on the lab: its unhealthy values are the findings `diagnose` gives (one
reading of the rules), not a second heuristic of its own."""

from __future__ import annotations

import json
import subprocess
import sys

from stethoscope.report.summary import summarize
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms

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


def test_summary_counts_each_nodes_samples_from_the_hourly_rollup_without_reading_raw_rows_final(store):
    """Regression: summary counted rows with `metrics FINAL` over the whole raw table, a merge of every
    raw row on each call (0.6 CPU-s per 5.5 M rows: hours on a fleet's 30 days). It reads the hourly
    rollup: samples as they landed (a replayed sample counts each time it landed), series, last."""
    now = now_ms()
    rows = [
        {"node_id": "node01", "metric_name": "gpu_temperature_celsius", "device": f"gpu{d}", "labels": {},
         "value": 50.0, "timestamp": now - 60_000 * i}
        for d in range(2) for i in range(3)
    ]  # fmt: skip
    store.insert_metrics(MetricColumns.from_rows(rows))
    store.insert_metrics(MetricColumns.from_rows(rows[:1]))  # a spool replay of one sample
    (node,) = summarize(store, [])
    assert (node.node_id, node.rows, node.series) == ("node01", 7, 2)
    listed = summarize(store, [], ["node01", "node09"])  # the inventory's node09 never reported
    assert [(s.node_id, s.rows) for s in listed] == [("node01", 7), ("node09", 0)]
    assert node.last_seen.startswith(iso(now)[:16].replace("T", " "))
    # a database from before the rollup: the raw rows, each stored row once
    store.command(f"DROP TABLE {store.database}.metrics_hourly_mv")
    store.command(f"DROP TABLE {store.database}.metrics_hourly")
    with Store(store.dsn, store.database) as before_the_rollup:
        (raw,) = summarize(before_the_rollup, [])
    assert (raw.rows, raw.series, raw.last_seen) == (6, 2, node.last_seen)
