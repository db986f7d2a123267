"""UNKNOWN findings (docs/design.md "Rules"): a metric a node reported within the last 24 h that has not
arrived for 3 of its report intervals. The silent metrics of one device are one finding about the
device; a node whose every metric stopped is one finding about the node. A metric a node never had is
not UNKNOWN; neither are training-job metrics (a job that ends stops reporting) nor what a benchmark
recorded (bench_* metrics, label phase=bench): benchmarks run on demand."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stethoscope.catalog import Catalog
from stethoscope.store.client import Store

LOOKBACK_SECONDS = 24 * 3600
MISSED_INTERVALS = 3
DEFAULT_INTERVAL = 60
NODE_RULE = "unknown.node"
DEVICE_RULE = "unknown.device"


@dataclass
class Silence:
    rule_id: str
    node_id: str
    device: str
    metrics: list[str]
    last_seen_ms: int


def _query(database: str, filtered: bool) -> str:
    fallback = (
        "if(arrayExists(p -> startsWith(metric_name, p), {families:Array(String)}), "
        "{family_interval:UInt32}, {default:UInt32})"
    )
    interval = (
        f"transform(toString(metric_name), {{names:Array(String)}}, {{intervals:Array(UInt32)}}, {fallback})"
    )
    per_series = (
        "SELECT node_id, metric_name, device, toUnixTimestamp64Milli(max(timestamp)) AS last_ms, "
        f"{interval} AS interval_s FROM {database}.metrics "
        "WHERE timestamp > fromUnixTimestamp64Milli({at:Int64}, 'UTC') - toIntervalSecond({lookback:UInt32}) "
        "AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') "
        "AND NOT startsWith(metric_name, 'train_') AND NOT startsWith(metric_name, 'cuda_') "
        "AND NOT startsWith(metric_name, 'bench_') "
        "AND labels['phase'] != 'bench' "
        + ("AND has({nodes:Array(String)}, node_id) " if filtered else "")
        + "GROUP BY node_id, metric_name, device"
    )
    flagged = (
        "SELECT *, last_ms < {at:Int64} - {missed:UInt32} * interval_s * 1000 AS stale, "
        "countIf(NOT stale) OVER (PARTITION BY node_id) AS fresh "
        f"FROM ({per_series})"
    )
    return (
        f"SELECT node_id, metric_name, device, last_ms, fresh FROM ({flagged}) WHERE stale "
        "ORDER BY node_id, device, metric_name"
    )


def silences(store: Store, catalog: Catalog, at_ms: int, nodes: Sequence[str] | None = None) -> list[Silence]:
    """The silences at `at_ms`, of every node or only of `nodes` (an inventory's hosts)."""
    families = sorted(catalog.families)
    params = {
        "at": at_ms,
        "lookback": LOOKBACK_SECONDS,
        "missed": MISSED_INTERVALS,
        "names": list(catalog.metrics),
        "intervals": [spec.interval for spec in catalog.metrics.values()],
        "families": families,
        "family_interval": min((catalog.families[f].interval for f in families), default=DEFAULT_INTERVAL),
        "default": DEFAULT_INTERVAL,
    }
    if nodes is not None:
        params["nodes"] = sorted(nodes)
    found: dict[tuple[str, str, str], Silence] = {}
    rows = store.query(_query(store.database, nodes is not None), params)
    for node_id, metric, device, last_ms, fresh in rows:
        # one finding per silent device (its metrics listed); a node of which nothing arrives any more
        # is one finding about the node
        rule_id, where = (NODE_RULE, "") if fresh == 0 else (DEVICE_RULE, device)
        silence = found.setdefault((rule_id, node_id, where), Silence(rule_id, node_id, where, [], 0))
        silence.metrics.append(metric)
        silence.last_seen_ms = max(silence.last_seen_ms, int(last_ms))
    return list(found.values())
