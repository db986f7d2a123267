"""Findings are recorded whether or not the loop acts: a dry-run `watch` stored none, so
`incidents --all` was empty after the demo and the board painted days green that `diagnose --at`
called critical. Now a dry-run cycle records its findings (no txn: nothing acted) and their life,
every cycle that evaluated leaves an `evaluations` row, a day no evaluation covered is grey "not
evaluated", and a finding a dry run recorded is still acted on by a later `--execute`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time

from test_execute import NODES, db, table

from stethoscope.remediation.ledger import Ledger
from stethoscope.remediation.record import DRY_RUN, record_dry_run, record_evaluation
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute

WINDOW_S = 6  # three reports at the 2 s the inventory declares: the finding can resolve within the test
DAY_MS = 86_400_000


def inventory(tmp_path):
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir(exist_ok=True)
    hosts = "\n".join(f"        {n}: {{slurm_name: {n}}}" for n in NODES)
    intervals = "{smart_reallocated_sector_ct: 2, smart_media_wearout_indicator_normalized: 2}"
    path.write_text(
        "---\nall:\n  vars:\n    ansible_connection: local\n"
        f"    stethoscope_metric_intervals: {intervals}\n"
        f"  children:\n    gpu_nodes:\n      hosts:\n{hosts}\n"
    )
    return path


def rules(tmp_path):
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "worn.yml").write_text(
        textwrap.dedent(f"""
        - rule_id: worn_ssd
          description: worn SSD (test)
          severity: critical
          level: L1
          message: "{{{{ node_id }}}} {{{{ device }}}} worn"
          trigger:
            - {{metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: {WINDOW_S}s,
               aggregate: last}}
            - {{metric: smart_media_wearout_indicator_normalized, operator: "<", threshold: 10,
               window: {WINDOW_S}s, aggregate: last}}
          action:
            - {{type: log, message: "{{{{ node_id }}}} {{{{ device }}}} worn ({{{{ txn_id }}}})"}}
        """)
    )
    return folder


def ssd(dsn: str, node: str, sectors: float, wear: float, from_ms: int, to_ms: int) -> None:
    """`node`'s SSD reported every second over [from_ms, to_ms], the rest of the inventory healthy."""
    batch = MetricColumns()
    for at in range(from_ms, to_ms + 1, 1000):
        batch.append(node, "smart_reallocated_sector_ct", "sda", {}, sectors, at)
        batch.append(node, "smart_media_wearout_indicator_normalized", "sda", {}, wear, at)
    for other in NODES:
        if other != node:
            batch.append(other, "gpu_temperature_celsius", "gpu0", {}, 40.0, from_ms)
    with Store(dsn) as store:
        store.insert_metrics(batch)


def stethoscope(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, *args],
        cwd=TOP,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def watch(tmp_path, dsn: str, cycles: int) -> subprocess.CompletedProcess:
    found = stethoscope(
        dsn, "watch", "--rules", str(rules(tmp_path)), "--inventory", str(inventory(tmp_path)),
        "--interval", "0.2", "--cycles", str(cycles),
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert "dry-run" in found.stdout and "Traceback" not in found.stderr
    return found


def finding_rows(dsn: str) -> list[tuple]:
    return table(
        dsn,
        "SELECT node_id, rule_id, argMax(txn_id, version), argMax(status, version), "
        "toUnixTimestamp64Milli(argMax(first_seen, version)), "
        "toUnixTimestamp64Milli(argMax(last_seen, version)), "
        "uniqExact(first_seen) FROM DB.findings GROUP BY finding_id, node_id, rule_id",
    )


def test_dry_run_watch_records_findings_and_their_life_and_execute_still_acts(tmp_path, db):
    start = now_ms()
    worn_until = start + 25_000  # the fault holds long enough for watch to start and run twice
    ssd(db, "node03", 184.0, 8.0, start - 10_000, worn_until)
    with Store(db) as store:  # a day with data that no cycle evaluated: the board must not call it green
        batch = MetricColumns()
        batch.append("node02", "gpu_temperature_celsius", "gpu0", {}, 40.0, start - 2 * DAY_MS)
        store.insert_metrics(batch)

    watch(tmp_path, db, cycles=2)
    ((node, rule, txn, status, first_ms, last_ms, firsts),) = finding_rows(db)
    assert (node, rule, txn, status) == ("node03", "worn_ssd", "", "open")
    assert firsts == 1 and first_ms < last_ms  # first_seen kept across the two cycles
    assert table(db, "SELECT count(), any(mode), min(rules) FROM DB.evaluations") == [(2, "dry-run", 1)]
    assert table(db, "SELECT count() FROM DB.actions") == [(0,)]  # nothing acted

    listed = stethoscope(db, "incidents", "--all", "--json")
    assert listed.returncode == 0, listed.stderr
    (entry,) = json.loads(listed.stdout)
    assert (entry["txn_id"], entry["node_id"], entry["status"], entry["rules"]) == (
        "",
        "node03",
        "open",
        ["worn_ssd"],
    )

    out = tmp_path / "board"
    report = stethoscope(db, "report", "--out", str(out), "--days", "3", "--no-model")
    assert report.returncode == 0, report.stderr
    board = (out / "index.html").read_text()
    row = re.search(r'<tr data-node="node02">(.*?)</tr>', board, re.S)
    assert row
    compute = re.findall(r'data-s="(\w+)"', row.group(1))[:3]  # the first band, oldest day first
    assert compute == ["unevaluated", "grey", "green"]  # two days ago: data, but nobody evaluated it
    page = next((out / "nodes").glob("node03-*.html")).read_text()
    assert "worn_ssd" in page and "No stored findings in the window" not in page

    # the fault clears: fresh data for a whole window, the finding resolves
    clear_at = max(worn_until, last_ms) + (WINDOW_S + 2) * 1000
    healthy_until = clear_at + 30_000  # beyond the next cycle, however slowly watch starts
    ssd(db, "node03", 0.0, 90.0, worn_until + 1000, healthy_until)
    time.sleep(max(0.0, (clear_at - now_ms()) / 1000))
    watch(tmp_path, db, cycles=1)
    ((_, _, txn, status, first_after, _, _),) = finding_rows(db)
    assert (txn, status, first_after) == ("", "resolved", first_ms)

    # worn again after the healthy rows (diagnosed at that instant, no waiting for it): a finding a
    # dry run recorded, resolved within its rule's cooldown, is new to the executor, which acts on it
    again = healthy_until + 5000
    ssd(db, "node03", 200.0, 5.0, healthy_until + 1000, again)
    log = f"stethoscope_diagnose_log={tmp_path / 'findings.log'}"
    executed = stethoscope(
        db, "diagnose", "--json", "--rules", str(rules(tmp_path)), "--execute", "--at", str(again / 1000),
        "--inventory", str(inventory(tmp_path)), "-e", log,
    )  # fmt: skip
    assert executed.returncode in (0, 1), executed.stderr
    (acted,) = json.loads(executed.stdout)
    assert acted["txn_id"] and acted["outcome"] == "log ok"
    (line,) = (tmp_path / "findings.log").read_text().splitlines()
    assert json.loads(line)["message"] == f"node03 sda worn ({acted['txn_id']})"
    ((_, _, txn, status, _, _, _),) = finding_rows(db)
    assert (txn, status) == (acted["txn_id"], "open")
    assert table(db, "SELECT mode FROM DB.evaluations ORDER BY at") == [("dry-run",)] * 3 + [("execute",)]


def test_one_shot_diagnose_stays_read_only(tmp_path, db):
    start = now_ms()
    ssd(db, "node03", 184.0, 8.0, start - 10_000, start + 60_000)
    found = stethoscope(
        db, "diagnose", "--json", "--rules", str(rules(tmp_path)), "--inventory", str(inventory(tmp_path))
    )
    assert found.returncode == 1, found.stderr
    assert [f["rule_id"] for f in json.loads(found.stdout)] == ["worn_ssd"]
    assert table(db, "SELECT count() FROM DB.findings") == [(0,)]
    assert table(db, "SELECT count() FROM DB.evaluations") == [(0,)]


def test_a_database_from_before_evaluations_gets_the_table_at_its_first_recorded_cycle(store):
    store.command(f"DROP TABLE {store.database}.evaluations")
    record_evaluation(store, now_ms(), DRY_RUN, 3, ["node01", "node02"], 1)
    rows = store.query(f"SELECT mode, rules, nodes, findings FROM {store.database}.evaluations")
    assert rows == [(DRY_RUN, 3, ["node01", "node02"], 1)]


def executor_finding(status: str, first_ms: int) -> dict:
    return {
        "finding_id": "f-exec", "txn_id": "tx-exec", "rule_id": "worn_ssd", "node_id": "node01",
        "device": "sda", "severity": "critical", "confidence": 1.0, "level": "L1",
        "message": "node01 sda worn", "evidence": "{}", "first_seen_ms": first_ms,
    }  # fmt: skip


def test_a_dry_run_leaves_the_executors_findings_alone_whatever_their_status(store):
    """A dry-run `watch` beside an executing `serve` wrote its own row over the executor's: a resolved
    finding lost its txn (the next executing cycle took it as new: a second incident, ticket, drain)."""
    at = now_ms()
    ledger = Ledger(store)
    open_one = executor_finding("open", at - 600_000)
    resolved = {**executor_finding("resolved", at - 600_000), "finding_id": "f-done", "txn_id": "tx-done"}
    ledger.write_findings([(open_one, "open", 1, at - 60_000), (resolved, "resolved", 1, at - 60_000)])
    before = ledger.known_findings()
    matched = [
        {**f, "txn_id": "", "severity": "warning", "level": "L0", "first_seen_ms": at}
        for f in (open_one, resolved)
    ]
    record_dry_run(store, matched, [], at, hosts=None, model_nodes=None)
    assert Ledger(store).known_findings() == before
