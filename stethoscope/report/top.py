"""`stethoscope top METRIC`: fleet-wide top-K nodes over a window (docs/design.md "Reports and audit").

Gauges rank by their worst value (the maximum, or the minimum where higher is better) with its time;
counters and events by their increase over the window (Prometheus semantics: a drop is a reset and the
new value counts as the increase since it) and its rate per second. Whole hours are read from
metrics_hourly, the partial hours at both ends from the raw rows, so the answer equals the one the raw
rows alone give (`via="raw"`, which the tests compare).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.store.client import Store
from stethoscope.terminal import terminal_safe
from stethoscope.timeutil import iso

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass(frozen=True)
class Entry:
    node_id: str
    device: str
    value: float  # the peak of a gauge, the increase of a counter
    at: str | None  # ISO-8601 time of the peak (gauges)
    rate_per_second: float | None = None  # counters and events

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Window:
    start_ms: int
    end_ms: int

    @property
    def whole_hours(self) -> tuple[int, int]:
        """[first, last) whole hours inside the window, in milliseconds."""
        first = -(-self.start_ms // HOUR_MS) * HOUR_MS
        last = self.end_ms // HOUR_MS * HOUR_MS
        return (first, max(first, last))


def glob_to_like(pattern: str) -> str:
    escaped = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%").replace("?", "_")


def _filters(device: str | None, labels: dict[str, str], params: dict[str, Any]) -> str:
    clauses = ["metric_name = {metric:String}"]
    if device:
        params["device"] = glob_to_like(device)
        clauses.append("device LIKE {device:String}")
    for i, (key, value) in enumerate(sorted(labels.items())):
        params[f"lk{i}"], params[f"lv{i}"] = key, value
        clauses.append(f"labels[{{lk{i}:String}}] = {{lv{i}:String}}")
    return " AND ".join(clauses)


def _ms(column: str) -> str:
    return f"fromUnixTimestamp64Milli({{{column}:Int64}}, 'UTC')"


def worse_is_lower(catalog: Catalog, metric: str) -> bool:
    spec = catalog.get(metric)
    return bool(spec and spec.better == "higher")


def is_cumulative(catalog: Catalog, metric: str) -> bool:
    spec = catalog.get(metric)
    return bool(spec and spec.kind != "gauge")


def top(
    store: Store,
    catalog: Catalog,
    metric: str,
    window: Window,
    limit: int = 10,
    device: str | None = None,
    labels: dict[str, str] | None = None,
    via: str = "rollup",
) -> list[Entry]:
    labels = labels or {}
    if is_cumulative(catalog, metric):
        entries = _counter_top(store, metric, window, device, labels, via)
    else:
        lower = worse_is_lower(catalog, metric)
        entries = _gauge_top(store, metric, window, device, labels, via, lower, limit)
    return entries[:limit]


def _parts(
    store: Store, metric: str, window: Window, device: str | None, labels: dict[str, str], via: str
) -> tuple[dict[str, Any], str, str, str]:
    """Parameters, the series filter, the WHERE of the raw rows and of the rollup for the window."""
    params: dict[str, Any] = {"metric": metric, "start": window.start_ms, "end": window.end_ms}
    where = _filters(device, labels, params)
    if via == "raw":
        raw = f"{where} AND timestamp >= {_ms('start')} AND timestamp <= {_ms('end')}"
        return params, where, raw, ""
    first, last = window.whole_hours
    params.update(h0=first, h1=last)
    raw = (
        f"{where} AND ((timestamp >= {_ms('start')} AND timestamp < {_ms('h0')}) "
        f"OR (timestamp >= {_ms('h1')} AND timestamp <= {_ms('end')}))"
    )
    hourly = f"{where} AND hour >= toDateTime({_ms('h0')}) AND hour < toDateTime({_ms('h1')})"
    return params, where, raw, hourly


def _gauge_top(
    store: Store,
    metric: str,
    window: Window,
    device: str | None,
    labels: dict[str, str],
    via: str,
    lower_is_worse: bool,
    limit: int,
) -> list[Entry]:
    params, where, raw_where, hourly_where = _parts(store, metric, window, device, labels, via)
    db = store.database
    # per node its worst (value, time, device, exact); of equal values the earliest, then the device
    best: dict[str, tuple[float, int, str, bool]] = {}

    def offer(node: str, dev: str, value: float, at: int, exact: bool) -> None:
        held = best.get(node)
        worse = (value if lower_is_worse else -value, at, dev)
        if held is None or worse < (held[0] if lower_is_worse else -held[0], held[1], held[2]):
            best[node] = (float(value), int(at), dev, exact)

    series = "GROUP BY node_id, device, labels_key"
    if hourly_where:
        # the rollup keeps the time of the maximum only: a minimum's hour is found here, its time below
        if lower_is_worse:
            pick = "min(min_value), toUnixTimestamp64Milli(toDateTime64(argMin(hour, (min_value, hour)), 3))"
            sql = f"SELECT node_id, device, {pick} FROM {db}.metrics_hourly WHERE {hourly_where} {series}"
        else:  # the time states are merged only in the hours that hold each series' maximum
            sql = (
                "SELECT node_id, device, max_value, toUnixTimestamp64Milli(argMaxMerge(max_at)) "
                f"FROM {db}.metrics_hourly WHERE {hourly_where} AND (node_id, device, labels_key, max_value) "
                f"IN (SELECT node_id, device, labels_key, max(max_value) FROM {db}.metrics_hourly "
                f"WHERE {hourly_where} {series}) {series}, max_value"
            )
        for node, dev, value, at in store.query(sql, params):
            offer(node, dev, value, at, not lower_is_worse)
        candidates = _partial_candidates(store, params, where, window, lower_is_worse, best)
        if candidates:
            params["cand"] = candidates
            raw_where += " AND (node_id, device, labels_key) IN {cand:Array(Tuple(String, String, String))}"
    if not hourly_where or candidates:
        ts = "toUnixTimestamp64Milli(timestamp)"
        pick = (
            f"min(value), argMin({ts}, (value, {ts}))"
            if lower_is_worse
            else f"max(value), argMax({ts}, (value, -{ts}))"
        )
        for node, dev, value, at in store.query(
            f"SELECT node_id, device, {pick} FROM {db}.metrics WHERE {raw_where} {series}", params
        ):
            offer(node, dev, value, at, True)
    ranked = sorted(best.items(), key=lambda item: (item[1][0] if lower_is_worse else -item[1][0], item[0]))
    entries = []
    for node, (value, at, dev, exact) in ranked[:limit]:
        if not exact:
            at, dev = _time_in_hour(store, params, where, node, value, at)
        entries.append(Entry(node, dev, value, iso(at)))
    return entries


def _partial_candidates(
    store: Store,
    params: dict[str, Any],
    where: str,
    window: Window,
    lower_is_worse: bool,
    whole: dict[str, tuple[float, int, str, bool]],
) -> list[tuple[str, str, str]]:
    """The series whose raw rows in the partial hours can change a node's answer: those whose rollup
    row for a partial hour (a bound on the part inside the window) reaches the node's whole-hours
    peak. The others' raw rows are not read, which keeps the query off the big day partitions."""
    first, last = window.whole_hours
    partial = ([first - HOUR_MS] if window.start_ms < first else []) + [last]
    pick = "min(min_value)" if lower_is_worse else "max(max_value)"
    rows = store.query(
        f"SELECT node_id, device, labels_key, {pick} FROM {store.database}.metrics_hourly WHERE {where} "
        "AND has({partial:Array(DateTime)}, hour) GROUP BY node_id, device, labels_key",
        {**params, "partial": [p // 1000 for p in partial]},
    )
    return [
        (node, dev, key)
        for node, dev, key, bound in rows
        if node not in whole or (bound <= whole[node][0] if lower_is_worse else bound >= whole[node][0])
    ]


def _time_in_hour(
    store: Store, params: dict[str, Any], where: str, node: str, value: float, hour_ms: int
) -> tuple[int, str]:
    """The earliest time (and its device) in the hour from `hour_ms` at which the node's series
    took `value`: of several devices with the same minimum in that hour, the earliest sample wins."""
    rows = store.query(
        f"SELECT toUnixTimestamp64Milli(timestamp) AS t, device FROM {store.database}.metrics WHERE {where} "
        "AND node_id = {node:String} AND value = {value:Float64} "
        f"AND timestamp >= {_ms('h')} AND timestamp < {_ms('h1')} ORDER BY t, device LIMIT 1",
        {**params, "node": node, "value": value, "h": hour_ms, "h1": hour_ms + HOUR_MS},
    )
    return int(rows[0][0]), rows[0][1]


def _counter_top(
    store: Store, metric: str, window: Window, device: str | None, labels: dict[str, str], via: str
) -> list[Entry]:
    params, _, raw_where, hourly_where = _parts(store, metric, window, device, labels, via)
    db = store.database
    # (series, time, min, max, last, summary): a raw sample has min = max = last
    sql = (
        "SELECT node_id, device, labels_key, toUnixTimestamp64Milli(timestamp), value, value, value, 0 "
        f"FROM {db}.metrics WHERE {raw_where}"
    )
    if hourly_where:
        sql += (
            " UNION ALL SELECT node_id, device, labels_key, toUnixTimestamp64Milli(toDateTime64(hour, 3)), "
            "min(min_value), max(max_value), argMaxMerge(last_value), 1 "
            f"FROM {db}.metrics_hourly WHERE {hourly_where} GROUP BY node_id, device, labels_key, hour"
        )
    series: dict[tuple[str, str, str], set[tuple[int, float, float, float, int]]] = defaultdict(set)
    for node_id, dev, key, *step in store.query(sql, params):
        series[(node_id, dev, key)].add(tuple(step))  # type: ignore[arg-type]
    per_device: dict[tuple[str, str], float] = defaultdict(float)
    unfolded = _unfold_resets(store, metric, {key: sorted(steps) for key, steps in series.items()})
    for (node_id, dev, _key), samples in unfolded.items():
        per_device[(node_id, dev)] += increase(samples)
    seconds = (window.end_ms - window.start_ms) / 1000
    best: dict[str, tuple[str, float]] = {}
    for (node_id, dev), total in sorted(per_device.items()):
        if node_id not in best or total > best[node_id][1]:
            best[node_id] = (dev, total)
    ranked = sorted(best.items(), key=lambda item: (-item[1][1], item[0]))
    return [Entry(node, dev, total, None, total / seconds) for node, (dev, total) in ranked]


def _unfold_resets(
    store: Store, metric: str, series: dict[tuple[str, str, str], list[tuple[int, float, float, float, int]]]
) -> dict[tuple[str, str, str], list[tuple[int, float, float, float]]]:
    """Every hourly summary whose value moved is replaced by its raw samples, all read in one query:
    (min, max, last) cannot tell a climb from a reset and a climb (0, 3, 0, 4 reads as 0..4). A still
    hour is exact from its summary; so is a reset at the hour's start followed by a climb."""
    moving = [
        (*key, at // 1000)
        for key, steps in series.items()
        for at, low, high, _, s in steps
        if s and low < high
    ]
    raw: dict[tuple[str, str, str, int], list[tuple[int, float, float, float]]] = defaultdict(list)
    if moving:
        rows = store.query(
            "SELECT DISTINCT node_id, device, labels_key, toUnixTimestamp64Milli(timestamp) AS t, value "
            f"FROM {store.database}.metrics WHERE metric_name = {{m:String}} AND "
            "(node_id, device, labels_key, "
            "toStartOfHour(timestamp)) IN {moving:Array(Tuple(String, String, String, DateTime))} ORDER BY t",
            {"m": metric, "moving": moving},
        )
        for node, dev, key, t, v in rows:
            raw[(node, dev, key, t // HOUR_MS * HOUR_MS)].append((t, v, v, v))
    out: dict[tuple[str, str, str], list[tuple[int, float, float, float]]] = {}
    for key, steps in series.items():
        unfolded: list[tuple[int, float, float, float]] = []
        for at, low, high, last, summary in steps:
            if summary and low < high and raw[(*key, at)]:
                unfolded.extend(raw[(*key, at)])
            else:  # still, or its raw rows expired (the rollup outlives them): its summary is all there is
                unfolded.append((at, low, high, last))
        out[key] = unfolded
    return out


def increase(steps: list[tuple[int, float, float, float]]) -> float:
    """Reset-aware increase over time-ordered (time, min, max, last) steps: raw samples and hourly
    summaries without a reset (a counter rises through them from min to last). The definition is the
    diagnosis engine's (`QueryBuilder.folded`: each step's rise, a drop counting its new value); this is it
    in Python over the same samples, and tests/diagnosis/test_counter_increase.py holds the two equal."""
    total, previous = 0.0, None
    for _, low, _, last in steps:
        if previous is None:
            previous = low
        total += last - previous if last >= previous else last
        previous = last
    return total


def window_of(days: float, end_ms: int) -> Window:
    return Window(end_ms - round(days * DAY_MS), end_ms)


def parse_labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--label {pair!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def render(entries: list[Entry], metric: str, cumulative: bool) -> str:
    if not entries:
        return f"no {metric} samples in the window"
    if cumulative:
        header = f"{'#':>3}  {'node':<24} {'device':<14} {'increase':>14} {'rate/s':>12}"
        lines = [
            f"{i:>3}  {e.node_id:<24} {e.device:<14} {e.value:>14.6g} {e.rate_per_second or 0:>12.4g}"
            for i, e in enumerate(entries, 1)
        ]
    else:
        header = f"{'#':>3}  {'node':<24} {'device':<14} {'peak':>14}  at"
        lines = [
            f"{i:>3}  {e.node_id:<24} {e.device:<14} {e.value:>14.6g}  {e.at}"
            for i, e in enumerate(entries, 1)
        ]
    return "\n".join([header, *map(terminal_safe, lines)])
