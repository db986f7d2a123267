"""UNKNOWN findings (docs/design.md "Rules"): what stopped arriving, and the nodes of the inventory that say
nothing.

A series is a node's metric on one device from one source (sweep rows, or `source=stream` rows); other
labels (an XID code) belong to it. It is silent when it reported within the last 24 h and has not
for 3 of its intervals; its interval is the larger of the declared one (the catalog as the inventory
sets it; for a `source=stream` series the stream's period, 5 s unless the inventory sets
`push_agent_period`, so an agent that stops is UNKNOWN once 3 periods are missing, judged
STREAM_ALLOWANCE seconds later for delivery and clock skew) and the spacing it has shown: from
`metrics_hourly`, the median spacing inside the hours that hold two samples or more ((last - first)
/ (n - 1): a partial hour says the same as a full one) where those are at least half of its hours,
else the mean gap between its hours (a series read hourly or every few hours, which a jittered pair
in one hour must not make look fast), else an hour. Nothing reads raw rows, except for a series with
rows after an evaluation time in the past: its hour being
evaluated comes from them, so that it sees only what had arrived by then.

- `unknown.device`: the silent metrics of one device of a node that still reports.
- `unknown.node`: a node whose every series is silent; with an inventory, also a listed node with
  nothing in the look-back (it never reported, or stopped more than 24 h ago), once the grace of a
  node new to the inventory (2 sweep intervals from its first `nodes` row, which the diagnosis writes
  when it first meets a host without one) is over. With an inventory,
  nodes outside it (gone from it) are no longer UNKNOWN.
- `unknown.unreachable` (warning): the latest `ansible_host_unreachable` of a node is 1 and no sweep
  row came after it; it takes the place of that node's `unknown.node`.
- `unknown.fleet` (critical): more than 10 % of the inventory (and at least 2 nodes) silent or
  unreachable at once: the pipeline (collector, network, store) is down rather than the nodes. Those
  nodes' own node/unreachable findings fold into it (listed in its evidence and `nodes`, so one alert
  and no per-node storm); device findings of nodes that still report stay.

Never UNKNOWN: a metric a node never had, training-job metrics (a job that ends stops reporting),
what a benchmark recorded (bench_*, label phase=bench), the unreachable probe itself, and the stream
collector's own health (device `collector`, stored under the controller's host name: a stopped
`serve` is no silent node).
UNKNOWN never resolves a rule finding: `silent_series` gives the silent set to whoever decides that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stethoscope.catalog import STREAM_INTERVAL, SWEEP_INTERVAL, Catalog
from stethoscope.diagnosis.cadence import SKIPPED, SPACING_SQL, hour_params, hours_sql
from stethoscope.inventory import Host, Inventory
from stethoscope.store.client import Store, StoreError
from stethoscope.timeutil import DurationError, positive_seconds

LOOKBACK_SECONDS = 24 * 3600
MISSED_INTERVALS = 3
DEFAULT_INTERVAL = 60
# a stream series is judged this much later than its 3 periods: the collector's one-second batch,
# the write (p99 2 s at 2,000 nodes, benchmarks/store_latency.py) and a clock a few seconds off
STREAM_ALLOWANCE = 10
GRACE_SWEEPS = 2
FLEET_FRACTION = 0.10
FLEET_MIN_NODES = 2  # one silent node is a node, whatever the size of the inventory
PROBE = "ansible_host_unreachable"
NODE_RULE = "unknown.node"
DEVICE_RULE = "unknown.device"
UNREACHABLE_RULE = "unknown.unreachable"
FLEET_RULE = "unknown.fleet"
FLEET_NODE = "fleet"


@dataclass
class Silence:
    rule_id: str
    node_id: str
    device: str
    metrics: list[str]
    last_seen_ms: int
    severity: str = "unknown"
    nodes: list[str] = field(default_factory=list)  # unknown.fleet: the silent nodes
    devices: dict[str, list[str]] = field(default_factory=dict)  # unknown.device: device -> its metrics
    empty: bool = False  # unknown.fleet: nothing at all from the inventory's nodes (or in the store)


@dataclass(frozen=True)
class Fleet:
    """The inventory UNKNOWN answers for: its hosts and the sweep interval they are read at."""

    hosts: tuple[Host, ...]
    sweep_interval: int = SWEEP_INTERVAL
    stream_interval: int = STREAM_INTERVAL

    @classmethod
    def of(cls, inventory: Inventory) -> Fleet:
        def seconds(name: str, default: int) -> int:
            value = inventory.settings.get(name)  # YAML may give 30, 30.0, "30" or "5m"
            try:
                return math.ceil(positive_seconds(value))  # above 0: at least 1
            except DurationError:  # none set, or none the catalog's check let through
                return default

        return cls(
            tuple(inventory.hosts.values()),
            seconds("stethoscope_sweep_interval", SWEEP_INTERVAL),
            seconds("push_agent_period", STREAM_INTERVAL),
        )

    @property
    def names(self) -> list[str]:
        return [host.name for host in self.hosts]


@dataclass
class Survey:
    silences: list[Silence]
    series: set[tuple[str, str, str]]  # (node, device, metric) of which no source sends any more
    nodes: set[str]  # nodes of which nothing arrives

    def __contains__(self, key: object) -> bool:
        """(node, device, metric): is that series silent, or its whole node?"""
        return isinstance(key, tuple) and len(key) == 3 and (key[0] in self.nodes or key in self.series)


def _query(db: str) -> str:
    fallback = (
        "if(arrayExists(p -> startsWith(metric_name, p), {families:Array(String)}), "
        "{family_interval:UInt32}, {default:UInt32})"
    )
    names = "{names:Array(String)}, {intervals:Array(UInt32)}"
    # a stream series stands on the stream's cadence, whatever the sweeps' interval for its metric
    swept = f"transform(toString(metric_name), {names}, {fallback})"
    declared = f"if(source = 'stream', {{stream:UInt32}}, {swept})"
    spacing = SPACING_SQL
    learned = (
        f"if(countIf(n >= 2) * 2 >= count(), {spacing}, "
        "if(uniqExact(hour) > 1, (toUnixTimestamp(max(hour)) - toUnixTimestamp(min(hour))) "
        "/ (uniqExact(hour) - 1), 3600))"
    )
    per_series = (
        "SELECT node_id, metric_name, device, source, max(last_ms) AS last, "
        f"argMax(last_value, last_ms) AS value, greatest({declared}, {learned}) AS interval_s "
        f"FROM ({hours_sql(db)}) GROUP BY node_id, metric_name, device, source "
        "HAVING last > {at:Int64} - {lookback:Int64} * 1000"
    )
    flagged = (
        "SELECT *, last < {at:Int64} - ({missed:UInt32} * interval_s "
        "+ if(source = 'stream', {allowance:UInt32}, 0)) * 1000 AS stale, "
        f"metric_name = '{PROBE}' AS probe, "
        "countIf(NOT stale AND NOT probe) OVER (PARTITION BY node_id) AS fresh, "
        "maxIf(last, NOT probe AND source != 'stream') OVER (PARTITION BY node_id) AS swept, "
        "countIf(NOT stale) OVER (PARTITION BY node_id, metric_name, device) AS flowing, "
        "row_number() OVER (PARTITION BY node_id) AS nth "
        f"FROM ({per_series})"
    )
    # the silent series, the probes, and one row for every node seen at all
    return (
        "SELECT node_id, metric_name, device, last, value, stale AND NOT probe, probe, fresh, swept, flowing "
        f"FROM ({flagged}) WHERE stale OR probe OR nth = 1 ORDER BY node_id, device, metric_name"
    )


def _params(catalog: Catalog, at_ms: int, stream_interval: int) -> dict[str, Any]:
    families = sorted(catalog.families)
    return {
        **hour_params(at_ms, LOOKBACK_SECONDS // 3600),
        "lookback": LOOKBACK_SECONDS,
        "missed": MISSED_INTERVALS,
        "names": list(catalog.metrics),
        "intervals": [spec.interval for spec in catalog.metrics.values()],
        "families": families,
        "family_interval": min((catalog.families[f].interval for f in families), default=DEFAULT_INTERVAL),
        "default": DEFAULT_INTERVAL,
        "stream": stream_interval,
        "allowance": STREAM_ALLOWANCE,
    }


def _require_rollup(store: Store) -> None:
    rows = store.query(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'metrics_hourly'",
        {"db": store.database},
    )
    if not rows or not rows[0][0]:
        raise StoreError(
            f"database {store.database} has no metrics_hourly: run `stethoscope db init` to create and "
            "backfill it"
        )


@dataclass
class _Node:
    fresh: int = 0
    swept_ms: int = 0
    silent: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # device -> (metric, last)
    unreachable_ms: int | None = None
    flowing: set[tuple[str, str]] = field(default_factory=set)  # (device, metric) another source still sends


def _nodes_seen(store: Store, catalog: Catalog, at_ms: int, stream_interval: int) -> dict[str, _Node]:
    seen: dict[str, _Node] = {}
    rows = store.query(_query(store.database), _params(catalog, at_ms, stream_interval))
    for node_id, metric, device, last_ms, value, silent, probe, fresh, swept, flowing in rows:
        node = seen.setdefault(node_id, _Node(int(fresh), int(swept)))
        if probe and value >= 1 and last_ms >= swept:
            node.unreachable_ms = int(last_ms)
        elif silent:
            node.silent.setdefault(device, []).append((metric, int(last_ms)))
            if flowing:
                node.flowing.add((device, metric))
    return seen


def _history(store: Store, names: list[str], at_ms: int) -> tuple[dict[str, int], dict[str, int]]:
    """For nodes not seen in the look-back: when each last reported, and its first `nodes` row."""
    if not names:
        return {}, {}
    db = store.database
    last = store.query(
        f"SELECT node_id, toUnixTimestamp64Milli(max(last_at)) FROM {db}.metrics_hourly "
        "WHERE node_id IN {names:Array(String)} AND last_at <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') "
        f"AND metric_name != '{PROBE}' AND {SKIPPED} GROUP BY node_id",
        {"names": names, "at": at_ms},
    )
    first = store.query(
        f"SELECT node_id, toUnixTimestamp64Milli(min(updated_at)) FROM {db}.nodes "
        "WHERE node_id IN {names:Array(String)} GROUP BY node_id",
        {"names": names},
    )
    return {n: int(t) for n, t in last}, {n: int(t) for n, t in first}


def _watched_since(store: Store, at_ms: int) -> int:
    """The first sight of a host no recording cycle has seen yet (a one-shot `diagnose` records none):
    the store's first `nodes` row, when it began to know the fleet; `at_ms` for a store without one."""
    rows = store.query(
        f"SELECT toUnixTimestamp64Milli(min(updated_at)), count() FROM {store.database}.nodes "
        "WHERE updated_at <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')",
        {"at": at_ms},
    )
    return int(rows[0][0]) if rows and rows[0][1] else at_ms


def record_new_hosts(store: Store, fleet: Fleet, at_ms: int) -> list[str]:
    """Give every inventory host without a `nodes` row one, at `at_ms`: its first sight, from which the
    grace of a new node counts. Returns the hosts recorded."""
    names = fleet.names
    known = {
        row[0]
        for row in store.query(
            f"SELECT DISTINCT node_id FROM {store.database}.nodes WHERE node_id IN {{names:Array(String)}}",
            {"names": names},
        )
    }
    new = [host for host in fleet.hosts if host.name not in known]
    store.insert_rows(
        "nodes",
        [
            {
                "node_id": h.name,
                "slurm_name": h.slurm_name,
                "rack": h.rack,
                "switch": h.switch,
                "groups": h.groups,
                "updated_at": at_ms,
            }
            for h in new
        ],
    )
    return [host.name for host in new]


def survey(store: Store, catalog: Catalog, at_ms: int, fleet: Fleet | None = None) -> Survey:
    _require_rollup(store)
    seen = _nodes_seen(store, catalog, at_ms, fleet.stream_interval if fleet else STREAM_INTERVAL)
    scope: Iterable[str] = seen if fleet is None else fleet.names
    absent = [] if fleet is None else [name for name in fleet.names if name not in seen]
    last_ms, first_ms = _history(store, absent, at_ms)
    unrecorded = _watched_since(store, at_ms) if set(absent) - set(first_ms) else at_ms
    grace_ms = GRACE_SWEEPS * (fleet.sweep_interval if fleet else SWEEP_INTERVAL) * 1000
    silences: list[Silence] = []
    series: set[tuple[str, str, str]] = set()
    whole: dict[str, Silence] = {}  # node -> its node or unreachable finding
    dark: set[str] = set()  # nodes of which nothing at all arrives
    for name in sorted(scope):
        node = seen.get(name)
        if node is None:
            never = name not in last_ms
            new = first_ms.get(name, unrecorded) > at_ms - grace_ms
            if not (never and new):
                whole[name] = Silence(NODE_RULE, name, "", [], last_ms.get(name, 0))
                dark.add(name)
            continue
        for device, metrics in node.silent.items():
            series.update((name, device, m) for m, _ in metrics if (device, m) not in node.flowing)
        stopped = [(metric, last) for metrics in node.silent.values() for metric, last in metrics]
        if node.fresh == 0:
            dark.add(name)
        if node.unreachable_ms is not None:
            whole[name] = Silence(
                UNREACHABLE_RULE,
                name,
                "",
                sorted(m for m, _ in stopped),
                node.unreachable_ms,
                severity="warning",
            )
        elif node.fresh == 0:
            whole[name] = Silence(NODE_RULE, name, "", sorted(m for m, _ in stopped), node.swept_ms)
        elif node.silent:  # one finding per node, its silent devices listed: one alert, not a storm
            devices = {device: sorted({m for m, _ in node.silent[device]}) for device in sorted(node.silent)}
            silent_metrics = sorted({m for names in devices.values() for m in names})
            last = max(t for _, t in stopped)
            silences.append(Silence(DEVICE_RULE, name, "", silent_metrics, last, devices=devices))
    if _nothing_at_all(store, fleet, seen, last_ms, at_ms):
        names = fleet.names if fleet is not None else []
        silences = [Silence(FLEET_RULE, FLEET_NODE, "", [], 0, severity="critical", nodes=names, empty=True)]
        return Survey(silences, series, set(names))
    if fleet is not None and FLEET_MIN_NODES <= len(whole) > FLEET_FRACTION * len(fleet.hosts):
        nodes = sorted(whole)
        last_seen = max(s.last_seen_ms for s in whole.values())
        silences.append(Silence(FLEET_RULE, FLEET_NODE, "", [], last_seen, severity="critical", nodes=nodes))
    else:
        silences.extend(whole.values())
    return Survey(silences, series, dark)


def _nothing_at_all(
    store: Store, fleet: Fleet | None, seen: dict[str, _Node], last_ms: dict[str, int], at_ms: int
) -> bool:
    """No node of the inventory has ever reported (whatever their grace: a store that is empty or
    points elsewhere is no new fleet), or, given no inventory, the store holds nothing of the last
    24 h: UNKNOWN, never healthy."""
    if fleet is not None:
        return not any(name in seen or name in last_ms for name in fleet.names)
    if seen:
        return False
    rows = store.query(
        f"SELECT count() FROM {store.database}.metrics_hourly "
        "WHERE hour >= toDateTime({from_s:Int64}, 'UTC') "
        "AND first_at <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')",
        {"from_s": (at_ms - LOOKBACK_SECONDS * 1000) // 1000, "at": at_ms},
    )
    return not rows or not rows[0][0]


def silences(store: Store, catalog: Catalog, at_ms: int, fleet: Fleet | None = None) -> list[Silence]:
    return survey(store, catalog, at_ms, fleet).silences


def silent_series(store: Store, catalog: Catalog, at_ms: int, fleet: Fleet | None = None) -> Survey:
    """What has stopped arriving: `(node, device, metric) in result` says whether a finding's data did
    (the series itself, or its whole node); a rule finding on silent data is stale, not resolved."""
    return survey(store, catalog, at_ms, fleet)
