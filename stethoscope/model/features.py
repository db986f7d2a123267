"""The model's input (docs/design.md "Learned diagnosis"): per node, the 12 features x 120 steps of 5 s
ending at `at_ms`, read for all nodes in one query, and their normalisation.

Step k covers (at - (120 - k) * 5 s, at - (119 - k) * 5 s] and takes each series' last sample in it;
the node's devices (and a job's ranks) are aggregated as the feature says. A step without a sample
carries the last value forward while it is at most `hold` old (the stream's 15 s; a swept metric's
1.5 x its catalog interval), else it is masked: never zero-filled. A node that streams a feature is
read from the stream's node part (device "node") and job part (device "job"); a node only swept is
read from the sweep's rows of the same name, or for a `_per_second` feature from the rate between
the sweep's samples of the matching `_total` counter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from stethoscope.catalog import default_catalog
from stethoscope.model.metadata import FEATURES, STEP_SECONDS, STEPS, Feature, ModelMeta
from stethoscope.store.client import Store

STREAM_HOLD_MS = 15_000
SWEEP_HOLD_FACTOR = 1.5
STREAM_DEVICES = ("node", "job")


@dataclass
class Windows:
    node_ids: list[str]
    x: np.ndarray  # float32 [N, STEPS, F], NaN where masked
    mask: np.ndarray  # float32 [N, STEPS, F], 1 observed (or carried), 0 gap
    hw_class: list[str]  # the class fingerprint's GPU model, "" when unknown
    job: list[str]  # the job label of the node's train_ rows, "" when it runs none


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


SQL = """SELECT node_id, metric_name, device, cityHash64(labels_key) AS series,
  labels['source'] = 'stream' AS stream, labels['job'] AS job, value,
  toUnixTimestamp64Milli(timestamp) AS ts
FROM {db}.metrics
WHERE timestamp > fromUnixTimestamp64Milli({start:Int64}, 'UTC')
  AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')
  AND metric_name IN {names:Array(String)}
  AND (labels['source'] != 'stream' OR device IN {stream_devices:Array(String)})
  %s
ORDER BY node_id, metric_name, device, labels_key, timestamp"""

CLASS_SQL = """SELECT node_id, argMax(detail, first_seen) FROM {db}.fingerprints
WHERE kind = 'class' %s GROUP BY node_id"""


def _codes(column) -> tuple[np.ndarray, list[str]]:
    """An arrow column as (integer codes, their strings), cheap for LowCardinality's dictionaries."""
    column = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if hasattr(column, "dictionary"):
        return column.indices.to_numpy(zero_copy_only=False), column.dictionary.to_pylist()
    values = np.asarray(column.to_pylist(), dtype=object)
    names, codes = np.unique(values.astype(str), return_inverse=True)
    return codes, names.tolist()


def read_windows(
    store: Store, at_ms: int, nodes: list[str] | None = None, features: tuple[Feature, ...] = FEATURES
) -> Windows:
    plan = _plan(tuple(features))
    span = STEPS * STEP_SECONDS * 1000
    params = {
        "start": int(at_ms) - span - plan.lookback_ms,
        "at": int(at_ms),
        "names": plan.names,
        "stream_devices": list(STREAM_DEVICES),
    }
    node_filter = ""
    if nodes is not None:
        node_filter = "AND node_id IN {nodes:Array(String)}"
        params["nodes"] = list(nodes)
    table = store.query_arrow(SQL.replace("{db}", store.database) % node_filter, params)
    node_codes, node_names = _codes(table.column("node_id"))
    node_ids = sorted(set(node_names[c] for c in np.unique(node_codes))) if nodes is None else list(nodes)
    position = {node: i for i, node in enumerate(node_ids)}
    node_index = np.array([position.get(name, -1) for name in node_names], dtype=np.int64)[node_codes]
    metric_codes, metric_names = _codes(table.column("metric_name"))
    device_codes, _ = _codes(table.column("device"))
    rows = _Rows(
        node=node_index,
        metric=metric_codes.astype(np.int64),
        device=device_codes.astype(np.int64),
        series=table.column("series").to_numpy(),
        stream=table.column("stream").to_numpy(zero_copy_only=False).astype(bool),
        value=table.column("value").to_numpy(),
        ts=table.column("ts").to_numpy().astype(np.int64),
    )
    x, mask = _resample(rows, metric_names, plan, len(node_ids), int(at_ms))
    job = _jobs(table, rows, metric_names, len(node_ids))
    return Windows(node_ids, x, mask, _hw_classes(store, node_ids, nodes is not None), job)


@dataclass
class _Rows:
    node: np.ndarray
    metric: np.ndarray
    device: np.ndarray
    series: np.ndarray
    stream: np.ndarray
    value: np.ndarray
    ts: np.ndarray

    def take(self, keep: np.ndarray) -> _Rows:
        return _Rows(*(getattr(self, k)[keep] for k in self.__dataclass_fields__))


def _resample(rows: _Rows, metric_names: list[str], plan: _Plan, n: int, at_ms: int):
    width = len(plan.features)
    feature_of = {f.metric: i for i, f in enumerate(plan.features)}
    metric_feature = np.array([feature_of.get(m, plan.counters.get(m, -1)) for m in metric_names] + [-1])
    metric_counter = np.array([m in plan.counters for m in metric_names] + [False])
    rows = rows.take(rows.node >= 0)
    feature = metric_feature[rows.metric]
    counter = metric_counter[rows.metric]
    # the source of each (node, feature): the stream where it streams, else the sweep's own name,
    # else the rate of the sweep's counter
    rank = np.where(rows.stream, 0, np.where(counter, 2, 1))
    best = np.full(n * width, 3)
    np.minimum.at(best, rows.node * width + feature, rank)
    rows, rank, feature = (
        rows.take(rank == best[rows.node * width + feature]),
        rank[rank == best[rows.node * width + feature]],
        feature[rank == best[rows.node * width + feature]],
    )
    value, ts = rows.value, rows.ts
    if (rank == 2).any():
        value, ts, keep = _rates(rows, rank == 2)
        rows, rank, feature = rows.take(keep), rank[keep], feature[keep]
        value, ts = value[keep], ts[keep]
    # bucket: step k (0..STEPS-1), or 0 for the samples before the window (carried into it)
    step_ms = STEP_SECONDS * 1000
    k = STEPS - 1 - (at_ms - ts) // step_ms
    before = k < 0
    slot = np.where(before, 0, k + 1)  # 0 = before the window, 1..STEPS = the steps
    # the last sample of each series in each bucket (rows arrive ordered by series, then time)
    series_change = np.ones(len(ts), dtype=bool)
    if len(ts) > 1:
        series_change[1:] = (
            (rows.node[1:] != rows.node[:-1])
            | (rows.metric[1:] != rows.metric[:-1])
            | (rows.device[1:] != rows.device[:-1])
            | (rows.series[1:] != rows.series[:-1])
        )
    last = np.ones(len(ts), dtype=bool)
    if len(ts) > 1:
        last[:-1] = series_change[1:] | (slot[1:] != slot[:-1])
    rows, feature, slot, value, ts = rows.take(last), feature[last], slot[last], value[last], ts[last]
    cells = (rows.node * width + feature) * (STEPS + 1) + slot
    shape = (n, width, STEPS + 1)
    total, count = np.zeros(shape), np.zeros(shape)
    low, high = np.full(shape, np.inf), np.full(shape, -np.inf)
    newest = np.full(shape, np.iinfo(np.int64).min)
    for grid, op, values in (
        (total, np.add, value),
        (count, np.add, 1),
        (low, np.minimum, value),
        (high, np.maximum, value),
        (newest, np.maximum, ts),
    ):
        op.at(grid.reshape(-1), cells, values)
    aggs = np.array([f.agg for f in plan.features])
    with np.errstate(invalid="ignore", divide="ignore"):
        by_agg = {"sum": total, "avg": total / count, "min": low, "max": high}
    value_grid = np.empty(shape)
    for agg, grid in by_agg.items():
        value_grid[:, aggs == agg] = grid[:, aggs == agg]
    seen = count > 0
    hold = _holds(plan, best.reshape(n, width))  # [n, width]
    ends = at_ms - (STEPS - 1 - np.arange(STEPS)) * step_ms  # end of each step
    t = np.arange(STEPS + 1)
    last_seen = np.maximum.accumulate(np.where(seen, t, -1), axis=2)[:, :, 1:]  # [n, w, STEPS]
    carried = np.take_along_axis(value_grid, np.clip(last_seen, 0, None), axis=2)
    age = ends[None, None, :] - np.take_along_axis(newest, np.clip(last_seen, 0, None), axis=2)
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


def _rates(rows: _Rows, is_counter: np.ndarray):
    """Counter rows become the rate since the series' previous sample (per second); a first sample
    or a reset (the counter went down) gives no rate."""
    value = rows.value.astype(float).copy()
    keep = np.ones(len(value), dtype=bool)
    same = np.zeros(len(value), dtype=bool)
    same[1:] = (
        (rows.node[1:] == rows.node[:-1])
        & (rows.metric[1:] == rows.metric[:-1])
        & (rows.device[1:] == rows.device[:-1])
        & (rows.series[1:] == rows.series[:-1])
    )
    idx = np.flatnonzero(is_counter)
    prev_ok = same[idx]
    delta = np.full(len(idx), np.nan)
    ok_idx = idx[prev_ok]
    dt = (rows.ts[ok_idx] - rows.ts[ok_idx - 1]) / 1000.0
    with np.errstate(invalid="ignore", divide="ignore"):
        delta[prev_ok] = (rows.value[ok_idx] - rows.value[ok_idx - 1]) / dt
    value[idx] = delta
    keep[idx] = np.isfinite(delta) & (delta >= 0)
    return value, rows.ts, keep


def _jobs(table, rows: _Rows, metric_names: list[str], n: int) -> list[str]:
    """Each node's job: the `job` label of its newest train_ row."""
    jobs = [""] * n
    train = np.array([m.startswith("train_") for m in metric_names] + [False])[rows.metric]
    train &= rows.node >= 0
    if not train.any():
        return jobs
    labels = table.column("job").to_numpy(zero_copy_only=False)
    order = np.flatnonzero(train)
    order = order[np.argsort(rows.ts[order], kind="stable")]
    for i in order:  # newest last: it wins
        if labels[i]:
            jobs[rows.node[i]] = str(labels[i])
    return jobs


def _hw_classes(store: Store, node_ids: list[str], filtered: bool) -> list[str]:
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
    logs = np.array([f.transform == "log1p" for f in meta.features])
    observed = mask > 0
    safe = np.where(observed, x, 0.0).astype(np.float64)
    safe[:, :, logs] = np.log1p(np.maximum(safe[:, :, logs], 0.0))
    mean = np.array([meta.norm_for(c).mean for c in hw_classes], dtype=np.float64)[:, None, :]
    std = np.array([meta.norm_for(c).std for c in hw_classes], dtype=np.float64)[:, None, :]
    if len(hw_classes) == 0:
        return np.zeros(x.shape, dtype=np.float32)
    return np.where(observed, (safe - mean) / std, 0.0).astype(np.float32)
