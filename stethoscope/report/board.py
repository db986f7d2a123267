"""The health board (docs/design.md "Reports and audit"): per node x day x layer the day's worst finding or
benchmark deviation. A cell is grey without data (no metrics_hourly samples of that layer that day) or
under UNKNOWN, never green. Findings come from two places: the `findings` table (what `serve`,
`watch` and `diagnose --execute` recorded, dry-run or not, with their first_seen..last_seen spans:
the history) and, for today's column, the rules evaluated now as `diagnose` and `summary` do (a
one-shot dry run records nothing, yet the board must show it). Past days are not re-evaluated:
seven rule cycles over a 2,000-node fleet would not fit the board's 10 s, and the stored findings
are what the loop decided on those days. A past day with data that no recorded evaluation (the
`evaluations` table) covered is "not evaluated", never green: nobody looked. A red or yellow cell's
node page lists the findings that coloured it, and the node's incidents, drains and tickets.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from stethoscope.bench import baseline
from stethoscope.catalog import LAYERS, Catalog, layer_of
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.layers import CLASS_LAYERS, rule_layer
from stethoscope.diagnosis.model_findings import ModelUse, agrees
from stethoscope.diagnosis.rules import Rule, load_rules
from stethoscope.paths import rules_dir
from stethoscope.private_files import private_dir, write_private
from stethoscope.remediation.action_events import ticket_key
from stethoscope.remediation.incident_view import incidents
from stethoscope.remediation.ledger import DRAIN, TICKET
from stethoscope.report import board_html
from stethoscope.report.board_cells import SYMBOL, Board, Cell, Event, NodeBoard, NodeIncident, Reason
from stethoscope.report.smart import smart_trends
from stethoscope.store.client import Store
from stethoscope.telemetry.udp_collector import SELF
from stethoscope.terminal import terminal_safe
from stethoscope.timeutil import iso

DAY_MS = 86_400_000
SEVERITY_STATE = {"critical": "red", "warning": "yellow", "info": "green"}
FIGURES_FOR = 10  # the worst nodes get inline figures on the board itself


def _days(days: int, now_ms: int) -> list[dt.date]:
    today = dt.datetime.fromtimestamp(now_ms / 1000, tz=dt.UTC).date()
    return [today - dt.timedelta(days=back) for back in range(days - 1, -1, -1)]


def _day_start_ms(day: dt.date) -> int:
    return int(dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC).timestamp() * 1000)


def _finding_layers(finding: dict[str, Any], layers: dict[str, str], catalog: Catalog) -> list[str]:
    if finding["rule_id"] in layers:
        return [layers[finding["rule_id"]]]
    try:
        evidence = json.loads(finding.get("evidence") or "{}")
    except ValueError:
        evidence = {}
    metrics = evidence.get("metrics") if isinstance(evidence, dict) else None
    if metrics:
        return sorted({layer_of(catalog, m) for m in metrics})
    return list(LAYERS)  # a whole node (nothing reported, unreachable)


def _state(severity: str, rule_id: str) -> str:
    if severity == "unknown" or rule_id.startswith("unknown"):
        return "grey"
    return SEVERITY_STATE.get(severity, "yellow")


def collect(
    store: Store,
    catalog: Catalog,
    days: int,
    now_ms: int,
    rules: list[Rule] | None = None,
    evaluate: bool = True,
    model: ModelUse | None = None,
    today: list[dict[str, Any]] | None = None,
) -> Board:
    """`model`: today's evaluation runs it too; `today`: today's findings already evaluated (serve's
    cycle), not evaluated again."""
    if rules is None:
        rules = load_rules(rules_dir(), catalog).rules
    layers = {rule.rule_id: rule_layer(rule, catalog) for rule in rules}
    day_list = _days(days, now_ms)
    labels = [d.isoformat() for d in day_list]
    start_ms = _day_start_ms(day_list[0])
    db = store.database
    nodes: dict[str, NodeBoard] = {}
    keys = [(lay, d) for lay in LAYERS for d in labels]

    def cell(node: str, layer: str, day: str) -> Cell:
        board = nodes.get(node)
        if board is None:
            board = nodes[node] = NodeBoard(node, {key: Cell() for key in keys})
        return board.cells[(layer, day)]

    names = [r[0] for r in store.query(f"SELECT DISTINCT metric_name FROM {db}.metrics_hourly")]
    if names:
        rows = store.query(
            "SELECT node_id, transform(metric_name, {names:Array(String)}, {layers:Array(String)}, "
            "'compute') AS layer, toString(toDate(hour)) AS day, sum(samples) "
            f"FROM {db}.metrics_hourly WHERE hour >= toDateTime({{start:Int64}} / 1000) "
            "AND device != {own:String} GROUP BY node_id, layer, day HAVING sum(samples) > 0",
            # the collector's own health is stored under the controller's host name: no node of the fleet
            {"names": names, "layers": [layer_of(catalog, n) for n in names], "start": start_ms, "own": SELF},
        )
        for node, layer, day, _count in rows:
            if day in labels:
                cell(node, layer, day).data = True

    stored = _stored_findings(store, start_ms)
    later = []  # model findings: beside the rule findings of their layer, so after them
    for owner, events in stored.items():
        for event, first_ms, last_ms, evidence in events:
            for node in shown_on(owner, _json(evidence).get("nodes")):
                if event.rule_id.startswith("model."):
                    later.append((node, event, first_ms, last_ms, evidence))
                    nodes.setdefault(node, NodeBoard(node, {key: Cell() for key in keys}))
                    nodes[node].events.append(event)
                    continue
                finding = {"rule_id": event.rule_id, "evidence": evidence}
                for layer in _finding_layers(finding, layers, catalog):
                    for day, day_ms in zip(labels, map(_day_start_ms, day_list), strict=True):
                        if first_ms < day_ms + DAY_MS and last_ms >= day_ms:
                            state = _state(event.severity, event.rule_id)
                            cell(node, layer, day).mark(state, f"{event.rule_id} ({event.severity})")
                            _explain(nodes[node], day, layer, state, vars(event), "recorded")
                cell(node, LAYERS[0], labels[0])  # the node is on the board even if its spans are older
                nodes[node].events.append(event)

    for node, event, first_ms, last_ms, evidence in later:
        for day, day_ms in zip(labels, map(_day_start_ms, day_list), strict=True):
            if first_ms < day_ms + DAY_MS and last_ms >= day_ms and event.kind == "opened":
                band = _model_mark(cell, catalog, node, day, event.rule_id, _json(evidence), event.message)
                if band:
                    _explain(nodes[node], day, band, "yellow", vars(event), "recorded")

    if evaluate or today is not None:  # today: what `diagnose` says now, stored or not
        found = today if today is not None else diagnose(store, rules, now_ms, catalog, model=model)
        for finding in found:
            if finding["rule_id"].startswith("model."):
                continue
            for node in finding["nodes"] or [finding["node_id"]]:
                for layer in _finding_layers(finding, layers, catalog):
                    state = _state(finding["severity"], finding["rule_id"])
                    cell(node, layer, labels[-1]).mark(
                        state, f"{finding['rule_id']} ({finding['severity']}): {finding['message']}"
                    )
                    _explain(nodes[node], labels[-1], layer, state, finding, "evaluated now")
        for finding in found:
            if finding["rule_id"].startswith("model."):
                said = _json(finding["evidence"])
                for node in shown_on(finding["node_id"], finding.get("nodes")):
                    band = _model_mark(
                        cell, catalog, node, labels[-1], finding["rule_id"], said, finding["message"]
                    )
                    if band:
                        _explain(nodes[node], labels[-1], band, "yellow", finding, "evaluated now")

    _grades(store, catalog, labels, cell, nodes)
    covered = evaluated_days(store, start_ms)
    if evaluate or today is not None:
        covered[labels[-1]] = None  # today's column is evaluated now
    for board in nodes.values():
        for (_layer, day), each in board.cells.items():
            nodes_that_day = covered.get(day, set())
            each.evaluated = day in covered and (nodes_that_day is None or board.node_id in nodes_that_day)
    for node_id, of_node in node_incidents(store, start_ms).items():
        if node_id in nodes:
            nodes[node_id].incidents = of_node
    for trend in smart_trends(store, now_ms):
        if trend.node_id in nodes:
            nodes[trend.node_id].trends.append(trend)
    ordered = sorted(nodes.values(), key=lambda n: (tuple(-x for x in n.score), n.node_id))
    for board in ordered:
        board.events.sort(key=lambda e: e.at)
        board.page = f"nodes/{page_name(board.node_id)}.html"
    return Board(labels, ordered, iso(now_ms))


def _explain(
    board: NodeBoard, day: str, layer: str, state: str, finding: dict[str, Any], source: str
) -> None:
    """Keep the finding that made a cell red or yellow, for the node's page."""
    if state in ("red", "yellow"):
        board.explain(
            Reason(
                day,
                layer,
                state,
                finding["rule_id"],
                finding["severity"],
                finding["device"],
                finding["message"],
                source,
            )
        )


def evaluated_days(store: Store, start_ms: int) -> dict[str, set[str] | None]:
    """Day -> the nodes a recorded evaluation covered that day (None: every node of the store). A
    day missing was not evaluated: its data, however healthy it looks, is nobody's verdict."""
    db = store.database
    present = store.query(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'evaluations'", {"db": db}
    )
    if not present or not present[0][0]:
        return {}  # a database from before evaluations were recorded: no day was
    covered: dict[str, set[str] | None] = {}
    for day, nodes in store.query(
        f"SELECT toString(toDate(at)) AS day, nodes FROM {db}.evaluations "
        "WHERE at >= fromUnixTimestamp64Milli({s:Int64}, 'UTC') GROUP BY day, nodes",
        {"s": start_ms},
    ):
        before = covered.get(day, set())
        covered[day] = None if before is None or not nodes else before | set(nodes)
    return covered


def node_incidents(store: Store, start_ms: int) -> dict[str, list[NodeIncident]]:
    """Per node, its incidents seen in the window (the executor's transactions) with their drains,
    tickets and other actions, from the findings and actions tables."""
    out: dict[str, list[NodeIncident]] = defaultdict(list)
    for found in incidents(store, include_resolved=True):
        if found.last_seen_ms < start_ms:
            continue
        drains = [a for a in found.actions if a.action == DRAIN]
        tickets = [a for a in found.actions if a.action == TICKET]
        entry = NodeIncident(
            found.txn_id,
            found.severity,
            found.status,
            ", ".join(found.rules),
            iso(found.first_seen_ms),
            "; ".join(f"{a.status} {a.target} {iso(a.started_ms)}" for a in drains),
            "; ".join(ticket_key(a.detail) or a.status for a in tickets),
            ", ".join(f"{a.action} {a.status}" for a in found.actions),
        )
        for node in sorted({found.node_id, *(n for f in found.findings for n in f.nodes)}):
            out[node].append(entry)
    return out


def shown_on(node_id: str, nodes: Any) -> list[str]:
    """The rows a finding is shown on: a correlated finding's (node_id `switch:leaf1`: a rule's
    `correlate_by`, or the model's congested switch) the nodes behind it that it names, as today's
    rule findings are; a switch is no node and gets no row. Else its own node."""
    named = [str(n) for n in nodes] if isinstance(nodes, list) else []
    return named if ":" in node_id and named else [node_id]


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _model_mark(
    cell: Any, catalog: Catalog, node: str, day: str, rule_id: str, evidence: dict[str, Any], message: str
) -> str:
    """A model finding beside a red or yellow cell of its layer (the rule finding it supports): a
    note, not a second alarm; where no rule finding of its layer is, a warning of its own, in the
    band of the metric that explains most of it (returned; "" when it only noted)."""
    bands = CLASS_LAYERS.get(str(evidence.get("layer", "")), ("compute",))
    if evidence.get("supports_band") in LAYERS:  # the band of the rule finding it supports
        bands = (*bands, str(evidence["supports_band"]))
    explanation = evidence.get("explanation") or {}
    support = {
        "rule_id": rule_id,
        "layer": evidence.get("layer", ""),
        "confidence": float(evidence.get("confidence", evidence.get("value", 0.0))),
        "explanation": explanation if isinstance(explanation, dict) else {},
    }
    beside = [band for band in bands if cell(node, band, day).state in ("red", "yellow")]
    for band in beside:
        cell(node, band, day).note(agrees(support))
    if not beside:
        top = layer_of(catalog, next(iter(support["explanation"]), ""))
        own = CLASS_LAYERS.get(str(evidence.get("layer", "")), ("compute",))
        band = top if top in own else own[0]
        cell(node, band, day).mark("yellow", f"{rule_id} (warning): {message}")
        return band
    return ""


def _stored_findings(store: Store, start_ms: int) -> dict[str, list[tuple[Event, int, int, str]]]:
    """The findings open in the window as timeline events: opened (first_seen), escalated (the
    executor's `escalate` action, or a stored version of higher severity not yet merged away), resolved
    or stale (last_seen)."""
    db = store.database
    escalations: dict[str, list[int]] = defaultdict(list)
    for fid, at in store.query(
        f"SELECT finding_id, toUnixTimestamp64Milli(started_at) FROM {db}.actions FINAL "
        "WHERE action = 'escalate' ORDER BY started_at"
    ):
        escalations[fid].append(int(at))
    rows = store.query(
        "SELECT finding_id, rule_id, node_id, device, severity, level, message, status, "
        "toUnixTimestamp64Milli(first_seen), toUnixTimestamp64Milli(last_seen), evidence "
        f"FROM {db}.findings WHERE last_seen >= fromUnixTimestamp64Milli({{s:Int64}}, 'UTC') "
        "ORDER BY finding_id, version",
        {"s": start_ms},
    )
    # a finding's span over all its versions: a still-open one's later rows (not merged yet) extend it
    spans: dict[str, tuple[int, int]] = {}
    for fid, *_, first, last, _evidence in rows:
        low, high = spans.get(fid, (int(first), int(last)))
        spans[fid] = (min(low, int(first)), max(high, int(last)))
    out: dict[str, list[tuple[Event, int, int, str]]] = defaultdict(list)
    previous: dict[str, tuple[str, str, str]] = {}
    rank = {"info": 0, "warning": 1, "critical": 2}
    for fid, rule_id, node, device, severity, level, message, status, first, last, evidence in rows:
        before = previous.get(fid)
        kinds = []
        if before is None:
            kinds.append(("opened", first))
            kinds += [("escalated", at) for at in escalations.get(fid, [])]
        elif not escalations.get(fid) and rank.get(severity, 0) > rank.get(before[0], 0):
            kinds.append(("escalated", last))
        if status in ("resolved", "stale") and (before is None or before[2] != status):
            kinds.append((status, last))
        previous[fid] = (severity, level, status)
        low, high = spans[fid]
        for kind, at in kinds:
            event = Event(iso(at), kind, rule_id, severity, device, message)
            span = {"opened": (low, high), "escalated": (at, high)}.get(kind, (first, last))
            out[node].append((event, *span, evidence))
    return out


def _grades(store: Store, catalog: Catalog, labels: list[str], cell: Any, nodes: dict) -> None:
    rows = baseline.summary_rows(baseline.build(store, catalog))
    if not rows:
        return
    latest = dict(
        store.query(
            f"SELECT node_id, toString(toDate(max(timestamp))) FROM {store.database}.bench_results "
            "GROUP BY node_id"
        )
    )
    for row in rows:
        day = latest.get(row.node_id)
        if day in labels:
            note = f"{row.metric_name} {row.deviation_percent:.1f} % off the fleet median"
            cell(row.node_id, layer_of(catalog, row.metric_name), day).mark(row.grade, note)
        if row.node_id in nodes:
            nodes[row.node_id].grades.append(row)


def page_name(node_id: str) -> str:
    """A file name for any node name (it is data: `<script>` or `../x` included)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", node_id).strip("._")[:40] or "node"
    return f"{slug}-{hashlib.sha1(node_id.encode()).hexdigest()[:8]}"


def write(board: Board, out: Path, figures_for: int = FIGURES_FOR) -> Path:
    private_dir(out / "nodes")  # and `out` itself, when missing
    if (out / "audit.html").exists():
        board.audit_page = "audit.html"
    if (out / "baseline.html").exists():  # `stethoscope baseline --out` into the same folder
        board.baseline_page = "baseline.html"
    for node in board.nodes[:figures_for]:
        drawn = [trend for trend in node.trends if len(trend.values) > 1]  # a trend needs two days
        if drawn:
            node.figure = board_html.trend_svg(drawn)
    write_private(out / "index.html", board_html.render_board(board))
    for node in board.nodes:
        write_private(out / node.page, board_html.render_node(board, node))
    return out / "index.html"


def board_record(board: Board) -> dict[str, Any]:
    """The board as `report --json` prints it: per node, one cell per layer and day."""
    return {
        "days": board.days,
        "layers": list(board.layers),
        "generated_at": board.generated_at,
        "nodes": [_node_record(node, board) for node in board.nodes],
    }


def _node_record(node: NodeBoard, board: Board) -> dict[str, Any]:
    cells = [
        {"layer": layer, "day": day, "state": cell.shown, "notes": list(cell.notes)}
        for layer in board.layers
        for day in board.days
        for cell in (node.cells[(layer, day)],)
    ]
    return {
        "node_id": node.node_id,
        "cells": cells,
        "events": [asdict(event) for event in node.events],
        "reasons": [asdict(reason) for reason in node.reasons],
        "incidents": [asdict(incident) for incident in node.incidents],
    }


_COLOUR = {
    "red": "\033[41;97m",
    "yellow": "\033[43;30m",
    "green": "\033[42;30m",
    "grey": "\033[47;30m",
    "unevaluated": "\033[47;30m",
}


def render_terminal(board: Board, color: bool = False, limit: int | None = None) -> str:
    if not board.nodes:
        return "no data in the window"
    names = {n.node_id: terminal_safe(n.node_id) for n in board.nodes[:limit]}
    width = max(10, *map(len, names.values()))
    days = len(board.days)
    head = " ".join(f"{layer[:days]:<{days}}" for layer in board.layers)
    lines = [f"{'node':<{width}}  {head}   ({board.days[0]} .. {board.days[-1]}, one column a day)"]
    for node in board.nodes[:limit]:
        bands = []
        for layer in board.layers:
            cells = [node.cells[(layer, day)] for day in board.days]
            text = "".join(f"{_COLOUR[c.shown]}{c.symbol}\033[0m" if color else c.symbol for c in cells)
            bands.append(text)
        lines.append(f"{names[node.node_id]:<{width}}  {' '.join(bands)}")
    lines.append(
        f"legend: {SYMBOL['red']} red  {SYMBOL['yellow']} yellow  {SYMBOL['green']} green  "
        f"{SYMBOL['grey']} no data / UNKNOWN  {SYMBOL['unevaluated']} not evaluated"
    )
    return "\n".join(lines)
