"""The `faults` table, the audit's ground truth (docs/design.md "Storage"), and `fault_windows`: when a
fault is recorded, the raw rows of its node before its impact are copied there, so that an audit can
replay them after the raw TTL has removed them."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import asdict, dataclass

from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms

# What an audit replays: instants over the 6 hours before impact. The copy reaches one hour further
# back, so that the rule windows of the earliest instants still find their samples.
WINDOW_MS = 6 * 3600 * 1000
LOOKBACK_MS = 3600 * 1000
SOURCES = ("confirmed", "added", "imported")


@dataclass(frozen=True)
class Fault:
    node_id: str
    kind: str
    layer: str
    impact_ms: int
    device: str = ""
    source: str = "added"
    note: str = ""

    @property
    def fault_id(self) -> str:
        key = f"{self.node_id}|{self.device}|{self.kind}|{self.impact_ms}"
        return hashlib.sha256(key.encode()).hexdigest()[:16]

    def as_dict(self) -> dict:
        return {"fault_id": self.fault_id, **asdict(self), "impact_at": iso(self.impact_ms)}


def _moment(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)


def record(store: Store, fault: Fault) -> int:
    """Store the fault (the same node, device, kind and impact again is the same row) and copy its
    node's raw rows before impact into fault_windows; returns the rows copied."""
    row = {
        "fault_id": fault.fault_id,
        "node_id": fault.node_id,
        "device": fault.device,
        "kind": fault.kind,
        "layer": fault.layer,
        "impact_at": _moment(fault.impact_ms),
        "source": fault.source,
        "note": fault.note,
        "recorded_at": _moment(now_ms()),
    }
    store.insert_rows("faults", [row])
    return copy_window(store, fault)


def _window_filter() -> str:
    return (
        "node_id = {node:String} AND timestamp > fromUnixTimestamp64Milli({start:Int64}, 'UTC') "
        "AND timestamp <= fromUnixTimestamp64Milli({end:Int64}, 'UTC')"
    )


def _window_params(fault: Fault) -> dict:
    return {
        "node": fault.node_id,
        "start": fault.impact_ms - WINDOW_MS - LOOKBACK_MS,
        "end": fault.impact_ms,
    }


def copy_window(store: Store, fault: Fault) -> int:
    """INSERT ... SELECT of the node's raw rows before impact. Idempotent: fault_windows's sorting key
    holds the raw table's columns (node first: it is read by node), so a row copied twice collapses,
    and reads use FINAL."""
    db = store.database
    params = _window_params(fault)
    (count,) = store.query(f"SELECT count() FROM {db}.metrics FINAL WHERE {_window_filter()}", params)[0]
    if count:
        store.command(
            f"INSERT INTO {db}.fault_windows (node_id, metric_name, device, labels, value, timestamp) "
            f"SELECT node_id, metric_name, device, labels, value, timestamp FROM {db}.metrics FINAL "
            f"WHERE {_window_filter()}",
            params,
        )
    return int(count)


def window_rows(store: Store, fault: Fault, table: str) -> int:
    """How many rows of the fault's window `table` (metrics or fault_windows) still holds."""
    sql = f"SELECT count() FROM {store.database}.{table} FINAL WHERE {_window_filter()}"
    return int(store.query(sql, _window_params(fault))[0][0])


def window_metrics(store: Store, fault: Fault) -> set[str]:
    """The metric names the fault's node reported in its window (in `store`.metrics)."""
    sql = f"SELECT DISTINCT metric_name FROM {store.database}.metrics WHERE {_window_filter()}"
    return {row[0] for row in store.query(sql, _window_params(fault))}


def first_sample_ms(store: Store, fault: Fault) -> int:
    """The time of the node's oldest sample at or before impact in `store`.metrics (impact if none)."""
    sql = (
        f"SELECT count(), toUnixTimestamp64Milli(min(timestamp)) FROM {store.database}.metrics "
        "WHERE node_id = {node:String} AND timestamp <= fromUnixTimestamp64Milli({end:Int64}, 'UTC')"
    )
    count, first = store.query(sql, _window_params(fault))[0]
    return int(first) if count else fault.impact_ms


def replay_window(store: Store, fault: Fault, scratch_database: str) -> None:
    """Copy the fault's window from fault_windows into `scratch_database`.metrics (an empty one)."""
    db = store.database
    store.command(
        f"INSERT INTO {scratch_database}.metrics (node_id, metric_name, device, labels, value, timestamp) "
        f"SELECT node_id, metric_name, device, labels, value, timestamp FROM {db}.fault_windows FINAL "
        f"WHERE {_window_filter()}",
        _window_params(fault),
    )


def list_faults(store: Store) -> list[Fault]:
    rows = store.query(
        "SELECT node_id, kind, layer, toUnixTimestamp64Milli(impact_at), device, source, note "
        f"FROM {store.database}.faults FINAL ORDER BY impact_at, node_id, device, kind"
    )
    return [Fault(n, k, lay, int(at), d, s, note) for n, k, lay, at, d, s, note in rows]


def stored_finding(store: Store, finding_id: str) -> tuple[str, str, str] | None:
    """(rule_id, node_id, device) of a stored finding, for `fault confirm`; None when there is none."""
    rows = store.query(
        f"SELECT rule_id, node_id, device FROM {store.database}.findings FINAL "
        "WHERE finding_id = {id:String}",
        {"id": finding_id},
    )
    return (str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None


def known_nodes(store: Store) -> set[str]:
    """Nodes the store knows: from the inventory table, the raw rows or the kept fault windows."""
    db = store.database
    sql = (
        f"SELECT node_id FROM {db}.nodes UNION DISTINCT SELECT DISTINCT node_id FROM {db}.metrics "
        f"UNION DISTINCT SELECT DISTINCT node_id FROM {db}.fault_windows"
    )
    return {row[0] for row in store.query(sql)}


def latest_sample_ms(store: Store) -> int | None:
    """The time of the newest raw sample (the lab's last sweep), None when there is none."""
    rows = store.query(
        f"SELECT count(), toUnixTimestamp64Milli(max(timestamp)) FROM {store.database}.metrics"
    )
    return int(rows[0][1]) if rows and rows[0][0] else None
