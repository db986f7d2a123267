"""Each rank's own times (docs/design.md "Learned diagnosis", job-relative): the job part's step,
collective and input times per (node, job, rank) series, on the same 120 steps as the node's
features and from the same query's rows (features.read_windows). The node's job features aggregate
its ranks (max); the job-relative detector needs them apart, because a straggler hides among its
own node's waiting ranks in a max just as it hides among its job's.

A step takes the series' newest sample in it and carries it while at most the stream's hold old,
as the node's features do; never zero-filled."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from stethoscope.model.metadata import STEP_SECONDS, STEPS

TIMES = ("train_step_time_ms", "train_allreduce_latency_ms", "train_data_wait_ms")
STEP, COMM, DATA = range(3)


@dataclass
class Ranks:
    job: list[str]  # [R] the job label
    rank: list[str]  # [R] the rank label
    node: np.ndarray  # [R] int: the index of the rank's node in Windows.node_ids
    x: np.ndarray  # float32 [R, STEPS, 3] (TIMES), NaN where masked
    mask: np.ndarray  # float32 [R, STEPS, 3]

    def __len__(self) -> int:
        return len(self.job)

    @classmethod
    def empty(cls) -> Ranks:
        shape = (0, STEPS, len(TIMES))
        return cls([], [], np.zeros(0, np.int64), np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def label_value(labels_key: str, name: str) -> str:
    """One label of a labels_key (ClickHouse's toString of the sorted map: {'job':'7','rank':'0'});
    "" where it has none."""
    match = re.search(r"'%s':'((?:[^'\\]|\\.)*)'" % re.escape(name), labels_key)
    return match.group(1).replace("\\'", "'") if match else ""


def rank_windows(
    node: np.ndarray,
    metric: np.ndarray,
    series: np.ndarray,
    value: np.ndarray,
    ts: np.ndarray,
    metric_names: list[str],
    series_names: list[str],
    at_ms: int,
    hold_ms: int,
) -> Ranks:
    """The job part's rows (node index, metric code, series code = labels_key, value, ts in ms) ->
    one window per (node, series) that carries a job and a rank label."""
    channel_of = np.array([TIMES.index(m) if m in TIMES else -1 for m in metric_names] + [-1])
    channel = channel_of[metric]
    keep = (node >= 0) & (channel >= 0)
    if not keep.any():
        return Ranks.empty()
    node, channel, series, value, ts = node[keep], channel[keep], series[keep], value[keep], ts[keep]
    width = int(series.max()) + 1
    keys, member = np.unique(node * width + series, return_inverse=True)
    member = member.reshape(-1)
    pairs = np.stack([keys // width, keys % width])
    labels = [series_names[int(code)] for code in pairs[1]]
    jobs = [label_value(text, "job") for text in labels]
    rank_labels = [label_value(text, "rank") for text in labels]
    count = pairs.shape[1]
    # bucket 0 holds what came before the window (carried into it), 1..STEPS the steps
    bucket = np.maximum(STEPS - 1 - (at_ms - ts) // (STEP_SECONDS * 1000) + 1, 0)
    cell = (member * len(TIMES) + channel) * (STEPS + 1) + bucket
    order = np.lexsort((ts, cell))  # each cell's newest sample last
    cell, ts, value = cell[order], ts[order], value[order]
    last = np.ones(len(cell), dtype=bool)
    last[:-1] = cell[1:] != cell[:-1]
    size = count * len(TIMES) * (STEPS + 1)
    flat = np.full(size, np.nan)
    flat[cell[last]] = value[last]
    newest = np.full(size, np.iinfo(np.int64).min)
    newest[cell[last]] = ts[last]
    grid = flat.reshape(count, len(TIMES), STEPS + 1)
    newest = newest.reshape(grid.shape)
    t = np.arange(STEPS + 1)
    last_seen = np.maximum.accumulate(np.where(newest > np.iinfo(np.int64).min, t, -1), axis=2)[:, :, 1:]
    at = np.clip(last_seen, 0, None)
    ends = at_ms - (STEPS - 1 - np.arange(STEPS)) * STEP_SECONDS * 1000
    age = ends[None, None, :] - np.take_along_axis(newest, at, axis=2)
    valid = (last_seen >= 0) & (age <= hold_ms)
    x = np.where(valid, np.take_along_axis(grid, at, axis=2), np.nan).astype(np.float32)
    named = np.array([bool(j) and bool(r) for j, r in zip(jobs, rank_labels, strict=True)])
    chosen = np.flatnonzero(named)
    return Ranks(
        [jobs[i] for i in chosen],
        [rank_labels[i] for i in chosen],
        pairs[0][chosen].astype(np.int64),
        np.ascontiguousarray(x[chosen].transpose(0, 2, 1)),
        np.ascontiguousarray(valid[chosen].transpose(0, 2, 1).astype(np.float32)),
    )
