"""The model's input (docs/design.md "Learned diagnosis"): per node, the 12 features x 120 steps of 5 s
ending at `at_ms`, read for all nodes in one query, and their normalisation.

Step k covers (at - (120 - k) * 5 s, at - (119 - k) * 5 s] and takes each series' last sample in it;
the node's devices (and a job's ranks) are aggregated as the feature says. A step without a sample
carries the last value forward while it is at most `hold` old (the stream's 15 s; a swept metric's
1.5 x its catalog interval), else it is masked: never zero-filled. A node that streams a feature is
read from the stream's node part (device "node") and job part (device "job"); a node only swept (no
node part in the window) is read from the sweep's rows of the same name, or for a `_per_second`
feature from the rate between the sweep's samples of the matching `_total` counter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from stethoscope.catalog import default_catalog
from stethoscope.model.metadata import FEATURES, STEP_SECONDS, STEPS, Feature, ModelMeta
from stethoscope.model.ranks import Ranks, label_value, rank_windows
from stethoscope.store.client import Store

STREAM_HOLD_MS = 15_000
# as UNKNOWN judges a stream series (diagnosis.unknown: 3 periods, 10 s later): a node whose agent has
# sent nothing for longer is not judged on the minutes it did send
STREAM_CURRENT_MS = 25_000
SWEEP_HOLD_FACTOR = 1.5


@dataclass
class Windows:
    node_ids: list[str]
    x: np.ndarray  # float32 [N, STEPS, F], NaN where masked
    mask: np.ndarray  # float32 [N, STEPS, F], 1 observed (or carried), 0 gap
    hw_class: list[str]  # the class fingerprint's GPU model, "" when unknown
    job: list[str]  # the job label of the node's train_ rows, "" when it runs none
    streamed: list[bool] = field(default_factory=list)  # a node part in the window (else only swept)
    # a node-part sample in the last STREAM_CURRENT_MS: its agent still sends (else the stream stopped)
    current: list[bool] = field(default_factory=list)
    ranks: Ranks = field(default_factory=Ranks.empty)  # each rank's own times (ranks.py)


@dataclass(frozen=True)
class _Plan:
    """Which metric names feed which feature, and how old a swept value may get."""

    features: tuple[Feature, ...]
    counters: dict[str, int]  # a `_total` name -> the index of the `_per_second` feature it feeds
    sweep_hold_ms: np.ndarray  # [F] for the feature's own name
    counter_hold_ms: np.ndarray  # [F] for its counter (0 where none)

    @property
    def names(self) -> list[str]:
        return [f.metric for f in self.features] + list(self.counters)

    @property
    def lookback_ms(self) -> int:
        # a counter's rate needs the sample before the oldest one it may carry into the window
        return int(max(STREAM_HOLD_MS, self.sweep_hold_ms.max(), 2 * self.counter_hold_ms.max()))


def _plan(features: tuple[Feature, ...]) -> _Plan:
    catalog = default_catalog()
    counters: dict[str, int] = {}
    sweep_hold = np.zeros(len(features))
    counter_hold = np.zeros(len(features))
    for i, feature in enumerate(features):
        spec = catalog.get(feature.metric)
        sweep_hold[i] = SWEEP_HOLD_FACTOR * 1000 * (spec.interval if spec else STEP_SECONDS)
        if feature.metric.endswith("_per_second"):
            total = feature.metric[: -len("_per_second")] + "_total"
            counter = catalog.get(total)
            if counter is not None and counter.kind == "counter":
                counters[total] = i
                counter_hold[i] = SWEEP_HOLD_FACTOR * 1000 * counter.interval
    return _Plan(features, counters, sweep_hold, counter_hold)


# One query, three parts. The stream's node part (device "node": one series per node and metric) and
# job part (device "job": a series per rank) are read without touching the labels map, the costly
# column; the sweep's rows only for nodes that do not stream (no node part in the window), so the
# GPU parts' rows (the bulk) and a streaming node's sweeps are dropped before a label is read. Which
# nodes do not stream is asked twice: of metrics_hourly, whose positive IN prunes the streaming nodes'
# granules by the primary key (a node with a node-part sample in the window has an hour whose last_at
# lies in it, so no swept node is lost), then exactly, of the raw rows, by NOT IN.
# ts is ms after {start}.
SQL = """SELECT node_id, metric_name, 0 AS part, toLowCardinality('') AS series, value,
  toInt32(toUnixTimestamp64Milli(timestamp) - {start:Int64}) AS ts
FROM {db}.metrics
WHERE device = 'node' AND metric_name IN {node_names:Array(String)}
  AND timestamp > fromUnixTimestamp64Milli({stream_start:Int64}, 'UTC')
  AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') %(nodes)s
UNION ALL
SELECT node_id, metric_name, 1 AS part, toLowCardinality(labels_key) AS series, value,
  toInt32(toUnixTimestamp64Milli(timestamp) - {start:Int64}) AS ts
FROM {db}.metrics
WHERE device = 'job' AND metric_name IN {job_names:Array(String)}
  AND timestamp > fromUnixTimestamp64Milli({stream_start:Int64}, 'UTC')
  AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') %(nodes)s
UNION ALL
SELECT node_id, metric_name, 2 AS part, toLowCardinality(concat(device, ' ', labels_key)) AS series,
  value,
  toInt32(toUnixTimestamp64Milli(timestamp) - {start:Int64}) AS ts
FROM {db}.metrics
PREWHERE metric_name IN {names:Array(String)}
  AND timestamp > fromUnixTimestamp64Milli({start:Int64}, 'UTC')
  AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') %(nodes)s
  AND device NOT IN ('node', 'job')
  AND node_id IN (
    SELECT node_id FROM {db}.metrics_hourly
    WHERE metric_name IN {names:Array(String)}
      AND hour >= toStartOfHour(fromUnixTimestamp64Milli({start:Int64}, 'UTC'))
      AND hour <= toStartOfHour(fromUnixTimestamp64Milli({at:Int64}, 'UTC')) %(nodes)s
    GROUP BY node_id
    HAVING countIf(device = 'node' AND last_at > fromUnixTimestamp64Milli({stream_start:Int64}, 'UTC')
      AND last_at <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')) = 0)
  AND node_id NOT IN (
    SELECT DISTINCT node_id FROM {db}.metrics
    WHERE device = 'node' AND metric_name IN {node_names:Array(String)}
      AND timestamp > fromUnixTimestamp64Milli({stream_start:Int64}, 'UTC')
      AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') %(nodes)s)
  AND labels['source'] != 'stream'"""
ARROW_SETTINGS = {"output_format_arrow_low_cardinality_as_dictionary": 1}
NODE, JOB, SWEEP = 0, 1, 2

CLASS_SQL = """SELECT node_id, argMax(detail, first_seen) FROM {db}.fingerprints
WHERE kind = 'class' %s GROUP BY node_id"""


def _codes(column) -> tuple[np.ndarray, list[str]]:
    """A string column of a table whose dictionaries are unified, as (integer codes, their strings)."""
    chunks = column.chunks
    if not chunks:
        return np.zeros(0, dtype=np.int64), []
    if not hasattr(chunks[0], "dictionary"):  # a server that sent plain strings
        encoded = column.combine_chunks().dictionary_encode()
        return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), encoded.dictionary.to_pylist()
    codes = np.concatenate([chunk.indices.to_numpy(zero_copy_only=False) for chunk in chunks])
    return codes.astype(np.int64), chunks[0].dictionary.to_pylist()


def read_windows(
    store: Store, at_ms: int, nodes: list[str] | None = None, features: tuple[Feature, ...] = FEATURES
) -> Windows:
    plan = _plan(tuple(features))
    span = STEPS * STEP_SECONDS * 1000
    start = int(at_ms) - span - plan.lookback_ms
    metrics = [f.metric for f in plan.features]
    params = {
        "start": start,
        "stream_start": int(at_ms) - span - STREAM_HOLD_MS,
        "at": int(at_ms),
        "names": plan.names,
        "node_names": [m for m in metrics if not m.startswith("train_")],
        "job_names": [m for m in metrics if m.startswith("train_")],
    }
    where = ""
    if nodes is not None:
        where = "AND node_id IN {nodes:Array(String)}"
        params["nodes"] = list(nodes)
    sql = SQL.replace("{db}", store.database) % {"nodes": where}
    table = store.query_arrow(sql, params, settings=ARROW_SETTINGS).unify_dictionaries()
    node_codes, node_names = _codes(table.column("node_id"))
    used = np.bincount(node_codes, minlength=len(node_names)) > 0
    present = sorted(name for name, seen in zip(node_names, used, strict=True) if seen)
    node_ids = present if nodes is None else list(nodes)
    position = {node: i for i, node in enumerate(node_ids)}
    node_index = np.array([position.get(name, -1) for name in node_names] + [-1], dtype=np.int64)
    metric_codes, metric_names = _codes(table.column("metric_name"))
    series_codes, series_names = _codes(table.column("series"))
    rows = _Rows(
        node=node_index[node_codes],
        metric=metric_codes,
        part=table.column("part").to_numpy().astype(np.int8),
        series=series_codes,
        value=table.column("value").to_numpy(),
        ts=table.column("ts").to_numpy().astype(np.int64) + start,
    )
    x, mask = _resample(rows, metric_names, plan, len(node_ids), int(at_ms))
    job = _jobs(rows, series_names, len(node_ids))
    streamed = np.zeros(len(node_ids) + 1, dtype=bool)
    streamed[rows.node[rows.part == NODE]] = True  # index -1 (a node not asked for) lands on the spare
    current = np.zeros(len(node_ids) + 1, dtype=bool)
    current[rows.node[(rows.part == NODE) & (rows.ts > int(at_ms) - STREAM_CURRENT_MS)]] = True
    hw = hw_classes(store, node_ids, nodes is not None)
    n = len(node_ids)
    on_job = rows.part == JOB
    ranks = rank_windows(
        rows.node[on_job],
        rows.metric[on_job],
        rows.series[on_job],
        rows.value[on_job],
        rows.ts[on_job],
        metric_names,
        series_names,
        int(at_ms),
        STREAM_HOLD_MS,
    )
    return Windows(node_ids, x, mask, hw, job, streamed[:n].tolist(), current[:n].tolist(), ranks)


@dataclass
class _Rows:
    node: np.ndarray
    metric: np.ndarray
    part: np.ndarray  # NODE, JOB, SWEEP
    series: np.ndarray  # codes: the job part's labels, the sweep's device and labels
    value: np.ndarray
    ts: np.ndarray

    def take(self, keep: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, k)[keep] for k in self.__dataclass_fields__))


class _Grid:
    """Per (node, feature, bucket) the aggregate of the values put in it, and its newest time.
    Bucket 0 holds what came before the window (carried into it), 1..STEPS the steps. A (node,
    feature) takes its values from one source only, so the parts never share a cell."""

    def __init__(self, n: int, width: int, aggs: np.ndarray):
        self.aggs = aggs
        self.value = np.full((n, width, STEPS + 1), np.nan)
        self.newest = np.full((n, width, STEPS + 1), np.iinfo(np.int64).min)

    @property
    def seen(self) -> np.ndarray:
        return self.newest > np.iinfo(np.int64).min

    def assign(self, cells: np.ndarray, value: np.ndarray, ts: np.ndarray) -> None:
        """For cells that get one value each (a series alone in its cell)."""
        self.value.reshape(-1)[cells] = value
        self.newest.reshape(-1)[cells] = ts

    def put(self, cells: np.ndarray, feature: np.ndarray, value: np.ndarray, ts: np.ndarray) -> None:
        """Several values per cell (devices, ranks), aggregated as their feature says."""
        flat = self.value.reshape(-1)
        np.maximum.at(self.newest.reshape(-1), cells, ts)
        agg = self.aggs[feature]
        for name in np.unique(agg):
            chosen = agg == name
            c, v = cells[chosen], value[chosen]
            if name == "max":
                np.fmax.at(flat, c, v)
            elif name == "min":
                np.fmin.at(flat, c, v)
            else:  # sum, avg
                unique, inverse = np.unique(c, return_inverse=True)
                total = np.bincount(inverse, weights=v)
                flat[unique] = total / np.bincount(inverse) if name == "avg" else total


def _resample(rows: _Rows, metric_names: list[str], plan: _Plan, n: int, at_ms: int):
    width = len(plan.features)
    feature_of = {f.metric: i for i, f in enumerate(plan.features)}
    metric_feature = np.array([feature_of.get(m, plan.counters.get(m, -1)) for m in metric_names] + [-1])
    metric_counter = np.array([m in plan.counters for m in metric_names] + [False])
    feature = metric_feature[rows.metric]
    keep = (rows.node >= 0) & (feature >= 0)
    pair = rows.node * width + feature
    # each (node, feature) is read from its best source: the stream, else the sweep's own name,
    # else the rate of the sweep's counter
    best = np.full(n * width, 3)
    swept = rows.part == SWEEP
    if swept.any():
        rank = np.where(metric_counter[rows.metric[swept]], 2, 1)
        np.minimum.at(best, pair[swept & keep], rank[keep[swept]])
        keep[swept] &= rank == best[pair[swept]]
    best[pair[~swept & keep]] = 0
    # bucket 0: before the window (carried into it); 1..STEPS: the steps
    step = STEPS - 1 - (at_ms - rows.ts) // (STEP_SECONDS * 1000)
    cell = pair * (STEPS + 1) + np.maximum(step + 1, 0)
    grid = _Grid(n, width, np.array([f.agg for f in plan.features]))
    alone = keep & (rows.part == NODE)
    if alone.any():  # the node part: one series per cell, its newest sample wins
        c, ts, value = cell[alone], rows.ts[alone], rows.value[alone]
        newest = np.full(n * width * (STEPS + 1), np.iinfo(np.int64).min)
        np.maximum.at(newest, c, ts)
        last = ts == newest[c]
        grid.assign(c[last], value[last], ts[last])
    for part in (JOB, SWEEP):
        chosen = keep & (rows.part == part)
        if chosen.any():
            r, c, f = rows.take(chosen), cell[chosen], feature[chosen]
            value, ts, ok = _series_last(r, metric_counter[r.metric], c)
            grid.put(c[ok], f[ok], value[ok], ts[ok])
    return _carry(grid, plan, best.reshape(n, width), at_ms)


def _series_last(r: _Rows, is_counter: np.ndarray, cell: np.ndarray):
    """For the rows of several series per cell (ranks, devices): counters turned into rates since the
    series' previous sample (none for a first sample or a reset), then each series' newest row per
    cell. Returns (value, ts, which rows to keep)."""
    key = (r.node * (int(r.metric.max()) + 1) + r.metric) * (int(r.series.max()) + 1) + r.series
    order = np.lexsort((r.ts, key))
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    key, ts, value = key[order], r.ts[order], r.value[order].astype(float)
    same = np.zeros(len(order), dtype=bool)
    same[1:] = key[1:] == key[:-1]
    ok = np.ones(len(order), dtype=bool)
    counter = is_counter[order]
    if counter.any():
        rate = np.full(len(order), np.nan)
        prev = np.flatnonzero(counter & same)
        with np.errstate(invalid="ignore", divide="ignore"):
            rate[prev] = (value[prev] - value[prev - 1]) / ((ts[prev] - ts[prev - 1]) / 1000.0)
        value = np.where(counter, rate, value)
        ok &= ~counter | (np.isfinite(rate) & (rate >= 0))
    c = cell[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = ~same[1:] | (c[1:] != c[:-1])
    ok &= last
    return value[inverse], ts[inverse], ok[inverse]


def _carry(grid: _Grid, plan: _Plan, source: np.ndarray, at_ms: int):
    value_grid, seen = grid.value, grid.seen
    hold = _holds(plan, source)  # [n, width]
    ends = at_ms - (STEPS - 1 - np.arange(STEPS)) * STEP_SECONDS * 1000
    t = np.arange(STEPS + 1)
    last_seen = np.maximum.accumulate(np.where(seen, t, -1), axis=2)[:, :, 1:]
    at = np.clip(last_seen, 0, None)
    carried = np.take_along_axis(value_grid, at, axis=2)
    age = ends[None, None, :] - np.take_along_axis(grid.newest, at, axis=2)
    valid = (last_seen >= 0) & (age <= hold[:, :, None])
    x = np.where(valid, carried, np.nan).astype(np.float32).transpose(0, 2, 1)
    return np.ascontiguousarray(x), np.ascontiguousarray(valid.transpose(0, 2, 1).astype(np.float32))


def _holds(plan: _Plan, source: np.ndarray) -> np.ndarray:
    """[n, F] how old a carried value may be, by the source each (node, feature) is read from."""
    return np.select(
        [source == 0, source == 1, source == 2],
        [STREAM_HOLD_MS, plan.sweep_hold_ms[None, :], plan.counter_hold_ms[None, :]],
        -1,
    )


def _jobs(rows: _Rows, series_names: list[str], n: int) -> list[str]:
    """Each node's job: the `job` label of its newest job-part row."""
    jobs = [""] * n
    index = np.flatnonzero((rows.part == JOB) & (rows.node >= 0))
    if not len(index):
        return jobs
    order = index[np.lexsort((rows.ts[index], rows.node[index]))]
    newest = order[np.r_[rows.node[order][1:] != rows.node[order][:-1], True]]
    for node, code in zip(rows.node[newest], rows.series[newest], strict=True):
        jobs[node] = label_value(series_names[code], "job")
    return jobs


def hw_classes(store: Store, node_ids: list[str], filtered: bool) -> list[str]:
    """Each node's GPU class: the GPU models of its class fingerprint, "" where it has none yet.
    `filtered`: read these nodes' fingerprints only (else every node's)."""
    params: dict = {}
    where = ""
    if filtered:
        where, params["nodes"] = "AND node_id IN {nodes:Array(String)}", node_ids
    found = dict(store.query(CLASS_SQL.replace("{db}", store.database) % where, params))
    return [_gpu_model(found.get(node, "")) for node in node_ids]


def _gpu_model(detail: str) -> str:
    try:
        models = (json.loads(detail).get("gpu") or {}).get("models") or []
    except (ValueError, AttributeError):
        return ""
    return ", ".join(str(m) for m in models)


def normalise(x: np.ndarray, mask: np.ndarray, meta: ModelMeta, hw_classes: list[str]) -> np.ndarray:
    """What the graphs get: log1p where the feature says, then (v - mean) / std of the node's hardware
    class (the default where the class has none), masked positions 0."""
    if len(hw_classes) == 0:
        return np.zeros(x.shape, dtype=np.float32)
    logs = np.array([f.transform == "log1p" for f in meta.features])
    observed = mask > 0
    safe = np.where(observed, x, 0.0).astype(np.float64)
    safe[:, :, logs] = np.log1p(np.maximum(safe[:, :, logs], 0.0))
    mean = np.array([meta.norm_for(c).mean for c in hw_classes], dtype=np.float64)[:, None, :]
    std = np.array([meta.norm_for(c).std for c in hw_classes], dtype=np.float64)[:, None, :]
    return np.where(observed, (safe - mean) / std, 0.0).astype(np.float32)
