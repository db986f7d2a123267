"""What landed in ClickHouse, per node: row counts and the latest values that look unhealthy.

"Unhealthy" here is the catalog's own reading, not a diagnosis (rules do that): an error counter
above zero, a flag in its worse state, an IB port not ACTIVE, NVMe endurance past 80 %.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from stethoscope.catalog import Catalog
from stethoscope.store.client import Store


@dataclass
class NodeSummary:
    node_id: str
    rows: int
    series: int
    last_seen: str
    notable: list[str] = field(default_factory=list)


# Bits of gpu_throttle_reasons_active that mean trouble (a power cap under load is healthy on an H200).
THROTTLE_TROUBLE = 0x8 | 0x20 | 0x40 | 0x80  # hw_slowdown, sw/hw thermal, hw power brake
WEAR_LEFT = ("smart_media_wearout_indicator_normalized", "smart_wear_leveling_count_normalized")
NOT_ERRORS = ("ib_port_xmit_wait_total",)  # congestion ticks: always counting on a busy port


def _is_notable(name: str, value: float, catalog: Catalog) -> bool:
    spec = catalog.get(name)
    if spec is None or name in NOT_ERRORS:
        return False
    if name == "ib_port_state":
        return value != 4
    if name == "gpu_throttle_reasons_active":
        return bool(int(value) & THROTTLE_TROUBLE)
    if name == "nvme_percentage_used":
        return value >= 80
    if name in WEAR_LEFT:
        return value < 20
    if name.startswith("smart_") and name not in ("smart_health_passed", "smart_exit_status"):
        return name in ("smart_reallocated_sector_ct", "smart_current_pending_sector") and value > 0
    if spec.better == "lower" and (spec.kind == "counter" or spec.unit == "count"):
        return value > 0
    if spec.unit in ("bool", "bitmask"):
        return (spec.better == "lower" and value != 0) or (spec.better == "higher" and value == 0)
    return False


def summarize(store: Store, catalog: Catalog) -> list[NodeSummary]:
    db = store.database
    totals = store.query(
        f"SELECT node_id, count(), uniqExact(metric_name, device, labels_key), toString(max(timestamp)) "
        f"FROM {db}.metrics FINAL GROUP BY node_id ORDER BY node_id"
    )
    latest = store.query(
        f"SELECT node_id, metric_name, device, toString(labels), argMax(value, timestamp) "
        f"FROM {db}.metrics FINAL GROUP BY node_id, metric_name, device, labels_key, labels "
        f"ORDER BY node_id, metric_name, device"
    )
    summaries = {node: NodeSummary(node, rows, series, last) for node, rows, series, last in totals}
    for node, name, device, labels, value in latest:
        if _is_notable(name, value, catalog):
            label_text = "" if labels == "{}" else f" {labels}"
            summaries[node].notable.append(f"{name}{{{device}}}{label_text} = {value:g}")
    return list(summaries.values())


def render(summaries: list[NodeSummary]) -> str:
    if not summaries:
        return "no metric rows stored yet"
    lines = [f"{'node':<14} {'rows':>7} {'series':>7}  last sample (UTC)        unhealthy values"]
    for item in summaries:
        first, *rest = item.notable or ["-"]
        lines.append(f"{item.node_id:<14} {item.rows:>7} {item.series:>7}  {item.last_seen:<24} {first}")
        lines.extend(f"{'':<56} {note}" for note in rest)
    return "\n".join(lines)
