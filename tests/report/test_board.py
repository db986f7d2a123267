"""The health board from a store: cell colours from stored findings and data availability, grey never
green, the findings timeline, SMART month-over-month growth, a page that fetches nothing."""

from __future__ import annotations

import datetime as dt
import re

import pytest

from stethoscope.catalog import Catalog
from stethoscope.remediation.ledger import Ledger
from stethoscope.report.board import DAY_MS, collect, render_terminal, write
from stethoscope.report.smart import month_growth
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

# The board's instant is the last noon (UTC) before the run: the seeds sit at 01:00-02:00 of each
# day, so a run in the first hours after midnight once found today empty and grey.
_REAL = now_ms()
NOW = _REAL - (_REAL - DAY_MS // 2) % DAY_MS
TODAY = NOW - NOW % DAY_MS
DAYS = [dt.datetime.fromtimestamp((TODAY - b * DAY_MS) / 1000, dt.UTC).date().isoformat() for b in (2, 1, 0)]


def sweeps(batch: MetricColumns, node: str, days_back: range, metric: str, device: str, value) -> None:
    for back in days_back:
        for hour in (1, 2):
            at = TODAY - back * DAY_MS + hour * 3_600_000
            if at < NOW:
                batch.append(node, metric, device, {}, value(back), at)


def finding(fid: str, node: str, rule_id: str, severity: str, first: int, metric: str = "") -> dict:
    return {
        "finding_id": fid, "txn_id": "t1", "rule_id": rule_id, "node_id": node, "device": "gpu0",
        "severity": severity, "confidence": 1.0, "level": "L1" if severity != "critical" else "L3",
        "message": f"{rule_id} on {node}", "evidence": f'{{"metrics": ["{metric}"]}}' if metric else "{}",
        "first_seen_ms": first,
    }  # fmt: skip


def board(store, tmp_path=None):
    return collect(store, Catalog.load(), 3, NOW, rules=[], evaluate=False)


def states(node_board, layer):
    return [node_board.cells[(layer, day)].shown for day in DAYS]


def evaluated(store, days_back, nodes=()):
    """What serve or watch records of each cycle: that it evaluated (`nodes`; none: the whole store)."""
    rows = [
        {"at": TODAY - back * DAY_MS + 3 * 3_600_000, "mode": "dry-run", "rules": 1, "nodes": list(nodes),
         "findings": 0, "host": "controller"}
        for back in days_back
    ]  # fmt: skip
    store.insert_rows("evaluations", rows)


def seeded(store):
    evaluated(store, range(3))  # the loop ran every day: a day without findings is green
    batch = MetricColumns()
    for node in ("hot", "warm", "calm", "silent"):
        sweeps(batch, node, range(3), "gpu_temperature_celsius", "gpu0", lambda back: 60.0)
    sweeps(batch, "calm", range(3), "nvlink_error_rate_percent", "gpu0/link0", lambda back: 0.0)
    sweeps(batch, "hot", range(3), "nvlink_error_rate_percent", "gpu0/link0", lambda back: 0.0)
    # a drive whose reallocated sectors go from 0 to 217 in three months
    for back in range(0, 91, 5):
        at = TODAY - back * DAY_MS + 3_600_000
        batch.append("hot", "smart_reallocated_sector_ct", "sda", {}, float(max(0, 217 - back * 3)), at)
    store.insert_metrics(batch)
    ledger = Ledger(store)
    hot = finding("f1", "hot", "nvlink_crc_errors", "warning", TODAY - DAY_MS, "nvlink_crc_errors_total")
    escalated = {**hot, "severity": "critical", "level": "L3"}
    warm = finding("f2", "warm", "gpu_hot", "warning", TODAY - 2 * DAY_MS, "gpu_temperature_celsius")
    silent = finding("f3", "silent", "unknown.silence", "unknown", TODAY + 60_000, "gpu_temperature_celsius")
    ledger.write_findings(
        [
            (hot, "open", 1, TODAY - DAY_MS + 60_000),
            (escalated, "open", 2, TODAY + 60_000),
            (warm, "resolved", 1, TODAY - 2 * DAY_MS + 60_000),
            (silent, "open", 1, TODAY + 60_000),
        ]
    )
    # what the executor records when a family member raises the severity
    store.insert_rows(
        "actions",
        [
            {"txn_id": "t1", "finding_id": "f1", "action": "escalate", "target": "hot", "status": "ok",
             "detail": '{"from": "warning", "to": "critical"}', "started_at": TODAY + 60_000,
             "finished_at": TODAY + 60_000, "version": 1},
        ],
    )  # fmt: skip


def test_board_cells_from_stored_findings_and_grey_where_no_data_or_unknown(store):
    seeded(store)
    nodes = {n.node_id: n for n in board(store).nodes}
    assert states(nodes["hot"], "communication") == ["green", "red", "red"]
    assert states(nodes["warm"], "compute") == ["yellow", "green", "green"]
    assert states(nodes["calm"], "compute") == ["green", "green", "green"]
    # no samples of the layer that day: grey, never green
    assert states(nodes["calm"], "storage") == ["grey", "grey", "grey"]
    assert states(nodes["warm"], "communication") == ["grey", "grey", "grey"]
    # data, yet UNKNOWN today: grey
    assert states(nodes["silent"], "compute") == ["green", "green", "grey"]


def test_a_day_with_data_that_no_recorded_evaluation_covered_is_not_evaluated_never_green(store):
    batch = MetricColumns()
    for node in ("calm", "other"):
        sweeps(batch, node, range(3), "gpu_temperature_celsius", "gpu0", lambda back: 60.0)
    store.insert_metrics(batch)
    evaluated(store, [1], nodes=["other"])  # yesterday's cycles evaluated another inventory
    evaluated(store, [0])
    nodes = {n.node_id: n for n in board(store).nodes}
    assert states(nodes["calm"], "compute") == ["unevaluated", "unevaluated", "green"]
    assert states(nodes["other"], "compute") == ["unevaluated", "green", "green"]
    assert states(nodes["calm"], "storage") == ["grey", "grey", "grey"]  # no data stays "no data"
    assert "\u2013 not evaluated" in render_terminal(board(store))


def test_a_red_cells_node_page_lists_the_findings_behind_it_and_the_incidents_drains_and_tickets(
    store, tmp_path
):
    seeded(store)
    store.insert_rows(
        "actions",
        [
            {"txn_id": "t1", "finding_id": "f1", "action": action, "target": "hot", "status": "ok",
             "detail": detail, "started_at": TODAY + 120_000, "finished_at": TODAY + 180_000, "version": 1}
            for action, detail in (
                ("playbook:remediate/drain.yml", "{}"),
                ("playbook:remediate/ticket.yml", '{"events": [{"msg": "ticket OPS-42 opened"}]}'),
            )
        ],
    )  # fmt: skip
    data = board(store)
    hot = next(n for n in data.nodes if n.node_id == "hot")
    assert {(r.day, r.layer, r.state, r.rule_id) for r in hot.reasons} >= {
        (DAYS[1], "communication", "red", "nvlink_crc_errors"),
        (DAYS[2], "communication", "red", "nvlink_crc_errors"),
    }
    (incident,) = hot.incidents
    assert (incident.txn_id, incident.severity) == ("t1", "critical")
    assert incident.drain.startswith("ok hot") and "ticket" in incident.actions
    write(data, tmp_path / "out")
    page = next((tmp_path / "out" / "nodes").glob("hot-*.html")).read_text(encoding="utf-8")
    assert "Why the cells are red or yellow" in page and "nvlink_crc_errors on hot" in page
    assert "t1" in page and "playbook:remediate/drain.yml ok" in page


def test_a_finding_still_open_paints_every_day_since_it_opened_before_its_rows_merge(store):
    """Two cycles' rows of one open finding, two inserts (not merged yet): the first row's span ended
    two days ago, and the days since were painted green while the finding was critical."""
    evaluated(store, range(3))
    batch = MetricColumns()
    sweeps(batch, "hot", range(3), "gpu_temperature_celsius", "gpu0", lambda back: 60.0)
    store.insert_metrics(batch)
    ledger = Ledger(store)
    hot = finding("f9", "hot", "gpu_hot", "critical", TODAY - 2 * DAY_MS, "gpu_temperature_celsius")
    ledger.write_findings([(hot, "open", 1, TODAY - 2 * DAY_MS + 60_000)])
    ledger.write_findings([(hot, "open", 2, TODAY + 60_000)])
    nodes = {n.node_id: n for n in board(store).nodes}
    assert states(nodes["hot"], "compute") == ["red", "red", "red"]


def test_board_orders_worst_nodes_first(store):
    seeded(store)
    assert [n.node_id for n in board(store).nodes][:2] == ["hot", "warm"]


def test_findings_timeline_shows_opened_escalated_and_resolved(store):
    seeded(store)
    nodes = {n.node_id: n for n in board(store).nodes}
    assert [e.kind for e in nodes["hot"].events] == ["opened", "escalated"]
    assert [e.kind for e in nodes["warm"].events] == ["opened", "resolved"]


def test_smart_reallocated_sectors_from_0_to_217_in_three_months_cross_the_50_percent_line(store):
    seeded(store)
    hot = next(n for n in board(store).nodes if n.node_id == "hot")
    trend = next(t for t in hot.trends if t.metric == "smart_reallocated_sector_ct")
    assert trend.values[0] == 0.0 and trend.values[-1] == 217.0
    assert trend.growth_percent == (217 - 127) / 127 * 100 and trend.alarming
    assert month_growth([(0, 0.0), (30, 5.0)]) == float("inf")
    assert month_growth([(0, 10.0), (30, 12.0)]) == 20.0


def test_board_page_fetches_nothing_links_the_audit_page_and_draws_figures_inline(store, tmp_path):
    seeded(store)
    out = tmp_path / "out"
    out.mkdir()
    (out / "audit.html").write_text("<!doctype html><title>audit</title>", encoding="utf-8")
    (out / "baseline.html").write_text("<!doctype html><title>baseline</title>", encoding="utf-8")
    page = write(board(store), out).read_text(encoding="utf-8")
    assert '<a href="audit.html">' in page and '<a href="baseline.html">' in page
    assert "<svg" in page and "50 % a month" in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched at view time
    assert "<link" not in page and "@import" not in page
    node_pages = sorted((out / "nodes").glob("*.html"))
    assert len(node_pages) == 4
    hot = next(p for p in node_pages if p.name.startswith("hot-")).read_text(encoding="utf-8")
    assert "escalated" in hot and "smart_reallocated_sector_ct" in hot


def test_node_name_with_markup_is_escaped_on_the_board_and_in_its_page_name(store, tmp_path):
    batch = MetricColumns()
    sweeps(batch, "<script>alert(1)</script>", range(1), "gpu_temperature_celsius", "gpu0", lambda b: 60.0)
    store.insert_metrics(batch)
    path = write(board(store), tmp_path / "out")
    page = path.read_text(encoding="utf-8")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert all("<" not in p.name and "/" not in p.stem for p in (tmp_path / "out" / "nodes").iterdir())


def test_terminal_board_colours_only_when_asked(store):
    seeded(store)
    data = board(store)
    plain, coloured = render_terminal(data), render_terminal(data, color=True)
    assert "\033[" not in plain and "\033[41" in coloured
    assert plain.splitlines()[1].startswith("hot")


def test_report_with_a_nonpositive_day_count_is_a_usage_error(tmp_dsn):
    from stethoscope.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main(["report", "--days", "0", "--dsn", tmp_dsn])
    assert exited.value.code == 2


def test_the_collectors_own_health_under_the_controllers_name_is_no_node_of_the_board(store):
    seeded(store)
    batch = MetricColumns()
    sweeps(batch, "controller-host", range(3), "telemetry_packets_rejected_total", "collector", lambda b: 0.0)
    store.insert_metrics(batch)
    assert "controller-host" not in {n.node_id for n in board(store).nodes}
