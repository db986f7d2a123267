"""What landed in ClickHouse, per node: samples, series, the last sample, and the findings `diagnose`
gives at the same moment (its rules, its UNKNOWN): one reading of "unhealthy", not a second one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stethoscope.diagnosis.engine import has_hourly_rollup
from stethoscope.store.client import Store
from stethoscope.store.ttl import raw_ttl_seconds
from stethoscope.terminal import terminal_safe


@dataclass
class NodeSummary:
    node_id: str
    rows: int
    series: int
    last_seen: str
    findings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def notable(self) -> list[str]:
        return [f"{f['rule_id']} ({f['severity']}): {f['message']}" for f in self.findings]


def initialised(store: Store) -> bool:
    """Whether `db init` has created the metrics table in the store's database."""
    found = store.query(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'metrics'",
        {"db": store.database},
    )
    return bool(found and found[0][0])


def summarize(
    store: Store, findings: list[dict[str, Any]], nodes: Sequence[str] | None = None
) -> list[NodeSummary]:
    """Per node of the store (and of `nodes`, the inventory's, those that never reported): samples,
    series, last sample, and `findings` (what `diagnose` gives, or serve's last cycle gave), those about
    no host (the fleet, the controller, a switch) under a row of their own: the same findings, one
    reading of "unhealthy"."""
    totals = _totals(store, nodes)
    summaries = {node: NodeSummary(node, rows, series, last) for node, rows, series, last in totals}
    for host in nodes or []:
        summaries.setdefault(host, NodeSummary(host, 0, 0, ""))
    for finding in findings:
        # a correlated finding is about a switch or rack: listed under each node behind it
        named = [node for node in finding["nodes"] or [finding["node_id"]] if node in summaries]
        for node in named or [finding["node_id"]]:
            summaries.setdefault(node, NodeSummary(node, 0, 0, "")).findings.append(finding)
    return sorted(summaries.values(), key=lambda s: s.node_id)


def _totals(store: Store, nodes: Sequence[str] | None) -> list[tuple[str, int, int, str]]:
    """Per node: samples, series and the last sample's time, from the hourly rollup over the raw TTL
    (a replayed sample counts each time it landed): one row per series and hour, where the raw table
    would need a FINAL merge of every row it holds. A database from before the rollup: the raw rows."""
    db, series = store.database, "uniqExact(metric_name, device, labels_key)"
    where: list[str] = []
    params: dict[str, Any] = {}
    if nodes is not None:
        where, params["nodes"] = ["node_id IN {nodes:Array(String)}"], sorted(nodes)
    if has_hourly_rollup(store):
        params["ttl"] = raw_ttl_seconds(store)
        where.append("hour >= toStartOfHour(now64(3, 'UTC') - toIntervalSecond({ttl:UInt32}))")
        return store.query(
            f"SELECT node_id, sum(samples), {series}, toString(max(last_at)) "
            f"FROM {db}.metrics_hourly WHERE {' AND '.join(where)} GROUP BY node_id ORDER BY node_id",
            params,
        )
    return store.query(
        f"SELECT node_id, count(), {series}, toString(max(timestamp)) FROM {db}.metrics FINAL "
        f"{'WHERE ' + where[0] + ' ' if where else ''}GROUP BY node_id ORDER BY node_id",
        params,
    )


def render(summaries: list[NodeSummary]) -> str:
    if not summaries:
        return "no metric rows stored yet"
    width = max(14, *(len(item.node_id) for item in summaries))  # FQDN host names included
    columns = f"{'samples':>7} {'series':>7}  last sample (UTC)        findings (as diagnose)"
    lines = [f"{'node':<{width}} {columns}"]
    for item in summaries:
        first, *rest = item.notable or ["-"]
        lines.append(f"{item.node_id:<{width}} {item.rows:>7} {item.series:>7}  {item.last_seen:<24} {first}")
        lines.extend(f"{'':<{width + 42}} {note}" for note in rest)
    return "\n".join(map(terminal_safe, lines))
