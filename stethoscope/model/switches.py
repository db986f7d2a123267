"""Congestion behind one switch (docs/design.md "Learned diagnosis"): it raises the
collective time of every rank of every job crossing the switch, while only the nodes behind it wait
to transmit. So the switch is judged by its nodes' transmit waits, not by any job's times.

Per node running a job in the recent steps, its IB transmit waits (log1p) at each step less a
reference: the median of its job's nodes behind other switches at the same step (congestion raises
them behind one switch only, a job that starts sending more raises them everywhere); where its job
has fewer than 2 nodes elsewhere, its own median over the window's first BASELINE steps. A node's
excess is the median of that over the last RECENT steps. A switch with at least MIN_NODES such
nodes is congested when the median excess of its nodes reaches RISE (waits twice as long) and
at least SHARE of them exceed CROSSED, unless the other switches' median does too (the whole fabric
is no one switch's fault). The finding names the jobs crossing it, and since when its nodes' waits
have stood over the line: congestion shows in the waits before the jobs' steps slow down."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from stethoscope.model.metadata import FEATURES
from stethoscope.model.path import Place
from stethoscope.model.robust import nanmedian

XMIT = [f.metric for f in FEATURES].index("ib_port_xmit_wait_per_second")
STEP_TIME = [f.metric for f in FEATURES].index("train_step_time_ms")
COLLECTIVE = [f.metric for f in FEATURES].index("train_allreduce_latency_ms")
BASELINE = 24  # the window's first 2 minutes
RECENT = 8  # its last 40 s: a neighbour's spell of heavy traffic (a few steps) moves no median
MIN_NODES = 3
RISE = float(np.log(2.0))
CROSSED = float(np.log(1.7))  # a node's waits count as risen from 1.7 times as long
SHARE = 0.6


@dataclass
class Crossing:
    job: str
    behind: int  # its nodes behind the switch
    nodes: int  # all its nodes
    collective_change: float  # its collective time, recent over baseline, minus 1 (NaN: unknown)


@dataclass
class Congestion:
    switch: str
    rise: float  # the median factor its nodes' waits exceed their reference by
    nodes: list[int]  # the nodes behind it whose waits rose (Windows indexes)
    judged: int  # its nodes judged
    jobs: list[Crossing] = field(default_factory=list)
    since_step: int = 0  # the step of the window from which its nodes' waits stood over the line


def _ran(mask: np.ndarray, steps: slice) -> np.ndarray:
    """[N] a job's step time in at least half of these steps."""
    return (mask[:, steps, STEP_TIME] > 0).mean(axis=1) >= 0.5


def congested(
    node_ids: list[str], x: np.ndarray, mask: np.ndarray, job: list[str], topology: Mapping[str, Place]
) -> tuple[list[Congestion], list[str]]:
    """x, mask: [N, steps, F] raw (not normalised) features as read_windows gives them. -> (the
    congested switches, every switch judged: with MIN_NODES nodes judged behind it)."""
    if not len(node_ids):
        return [], []
    logs = np.log1p(np.maximum(x[:, :, XMIT], 0.0)).astype(np.float64)
    waits = np.where(mask[:, :, XMIT] > 0, logs, np.nan)
    recent = _ran(mask, slice(-RECENT, None)) & np.array([bool(j) for j in job])
    early = _ran(mask, slice(0, BASELINE))
    base = nanmedian(waits[:, :BASELINE], axis=1)
    switch = [topology.get(node, Place()).switch for node in node_ids]
    by_job: dict[str, list[int]] = {}
    for running in np.flatnonzero(recent).tolist():
        by_job.setdefault(job[running], []).append(running)
    excess = np.full(waits.shape, np.nan)
    for members in by_job.values():
        for name in {switch[m] for m in members}:
            here = [m for m in members if switch[m] == name]
            elsewhere = [m for m in members if switch[m] != name]
            if len(elsewhere) >= 2:
                excess[here] = waits[here] - nanmedian(waits[elsewhere], axis=0)[None, :]
            else:
                early_here = [m for m in here if early[m]]
                excess[early_here] = waits[early_here] - base[early_here, None]
    level = nanmedian(excess[:, -RECENT:], axis=1)
    by_switch: dict[str, list[int]] = {}
    for node, name in enumerate(switch):
        if name and np.isfinite(level[node]):
            by_switch.setdefault(name, []).append(node)
    judged = sorted(name for name, members in by_switch.items() if len(members) >= MIN_NODES)
    levels = {name: float(np.median(level[members])) for name, members in by_switch.items()}
    found = []
    for name in judged:
        members = by_switch[name]
        others = [value for other, value in levels.items() if other != name]
        risen = [m for m in members if level[m] >= CROSSED]
        if levels[name] < RISE or len(risen) < SHARE * len(members):
            continue
        if others and float(np.median(others)) >= RISE:
            continue
        found.append(
            Congestion(
                name,
                float(np.exp(levels[name])),
                risen,
                len(members),
                _crossing(members, job, x, mask, by_job),
                _since(excess[members]),
            )
        )
    return found, judged


def _crossing(
    behind: list[int], job: list[str], x: np.ndarray, mask: np.ndarray, by_job: dict[str, list[int]]
) -> list[Crossing]:
    out = []
    for name in sorted({job[i] for i in behind if job[i]}):
        members = by_job.get(name, [])
        comm = np.where(
            mask[members, :, COLLECTIVE] > 0, x[members, :, COLLECTIVE].astype(np.float64), np.nan
        )
        before = nanmedian(comm[:, :BASELINE])
        after = nanmedian(comm[:, -RECENT:])
        change = float(after / before - 1.0) if before and np.isfinite(before) else float("nan")
        out.append(Crossing(name, sum(job[i] == name for i in behind), len(members), change))
    return sorted(out, key=lambda c: (-c.behind, c.job))


def _since(excess: np.ndarray) -> int:
    """The first step from which the switch's nodes' median excess stays over the line to the end
    (0: since before the window)."""
    level = nanmedian(excess, axis=0)
    over = np.nan_to_num(level, nan=-np.inf) >= RISE
    below = np.flatnonzero(~over[: len(over) - RECENT // 2])
    return int(below[-1] + 1) if len(below) else 0
