"""The job-relative detector (docs/design.md "Learned diagnosis"): in a synchronous job
every rank's step takes as long as the slowest rank's, so a fault on one rank shows on all of them.
What tells the culprit from its peers is how each rank spends the shared step:

- a straggler computes longer, and the others wait for it in the collective;
- a rank stalled on its input waits for data, and the others wait for it in the collective.

Per job (at least MIN_RANKS ranks sending their step, collective and input times) and per recent
step, each rank's compute (step - collective - input), input wait and collective time less the
median of the job's ranks at that step, as a share of the step's median; per rank the median of
those over the recent steps (a checkpoint or a hiccup of a step or two moves no median); against its
reference a robust z-score: (value - median) / max(1.4826 MAD, FLOOR). A rank's reference is the
job's ranks on other nodes and itself: a job runs several ranks a node (8 on an 8-GPU node), and a
node's fault (its disk, its NFS mount) holds all of them, which in a job of two nodes would set the
median itself; with one rank a node, and for a job on one node, it is all the job's ranks. A culprit
is a rank whose compute or input stands out by Z and by at least SHARE of the step, by Z standard
errors of a level too (the job's ranks' typical step-to-step spread over the root of the steps:
where the input wait varies widely from step to step, some rank's median lies high by chance while
the ranks' medians, by chance close together, make a small MAD), while its collective time is lower
than its peers' by at least half that (it holds them back, it does not wait with them); it holds
back the ranks whose collective time exceeds its own by half its excess. More than a quarter of a
job standing out is not a culprit but a job whose ranks differ (pipeline stages), counted in nodes
(culprits on more than a quarter of the job's nodes) and, on a node, in ranks (more than a quarter
of its ranks of the job, unless all of them: the node's own fault).

Deterministic, numpy only, no training: beside the ONNX graphs, each is measured against the other
(`stethoscope model evaluate`, benchmarks/model_jobs.py)."""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from stethoscope.model.ranks import COMM, DATA, STEP, Ranks
from stethoscope.model.robust import nanmedian

MIN_RANKS = 4
RECENT = 24  # 2 minutes at 5 s
MIN_STEPS = 12  # recent steps a rank must have sent all three times in
FLOOR = 0.01  # of the step: the spread a lockstep job's ranks are never judged below
Z = 4.0
SHARE = 0.03  # a culprit's extra compute or input wait, as a share of the step
CORROBORATION = 0.5  # its collective time lower than its peers' by at least this part of its excess
STEADY = Z  # its excess in standard errors of a rank's level: as sure against the steps' noise as Z
WAITS = 0.5  # a peer it holds back waits at least this part of the culprit's excess longer than it
KINDS = {"compute": "compute", "input": "storage"}  # what the culprit spends longer on -> model class


@dataclass
class Culprit:
    job: str
    rank: str
    index: int  # into Ranks
    node: int  # into Windows.node_ids
    kind: str  # "compute" or "input"
    layer: str  # the model class it speaks for: compute or storage
    excess: float  # the extra compute or input wait, a share of the step
    z: float
    waits_less: float  # how much less it waits in the collective than its peers, a share of the step
    holds_back: list[int]  # indexes into Ranks of the peers that wait for it
    ranks: int  # the job's ranks judged


@dataclass
class JobJudgement:
    culprits: list[Culprit] = field(default_factory=list)
    judged: dict[str, list[int]] = field(default_factory=dict)  # job -> its ranks judged (Ranks indexes)
    # job -> per judged rank the robust z of (compute, input, collective), for the evidence
    z: dict[str, np.ndarray] = field(default_factory=dict)


def robust_z(values: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """(z, excess): each value's distance from the median, in units of max(1.4826 MAD, floor)."""
    centre = float(np.median(values))
    excess = values - centre
    scale = max(1.4826 * float(np.median(np.abs(excess))), floor)
    return excess / scale, excess


def components(ranks: Ranks, recent: int = RECENT) -> np.ndarray:
    """[R, recent, 3] each rank's (compute, input, collective) in ms over the recent steps; NaN at a
    step where it did not send all three."""
    x = ranks.x[:, -recent:, :].astype(np.float64)
    full = (ranks.mask[:, -recent:, :] > 0).all(axis=2)
    step, comm, data = (np.where(full, x[:, :, k], np.nan) for k in (STEP, COMM, DATA))
    compute = np.maximum(step - comm - data, 0.0)
    return np.stack([compute, data, comm, step], axis=2)


def judge_jobs(ranks: Ranks, recent: int = RECENT) -> JobJudgement:
    out = JobJudgement()
    if not len(ranks):
        return out
    parts = components(ranks, recent)
    full = ~np.isnan(parts[:, :, 0])
    enough = full.sum(axis=1) >= MIN_STEPS
    by_job: dict[str, list[int]] = {}
    for index, job in enumerate(ranks.job):
        if enough[index]:
            by_job.setdefault(job, []).append(index)
    for job, members in sorted(by_job.items()):
        if len(members) < MIN_RANKS:
            continue
        chosen = parts[members]  # [r, T, 4]
        per_step = (~np.isnan(chosen[:, :, 0])).sum(axis=0) >= MIN_RANKS
        chosen = np.where(per_step[None, :, None], chosen, np.nan)
        scale = nanmedian(chosen[:, :, 3], axis=0)  # the step's median across ranks [T]
        centre = nanmedian(chosen[:, :, :3], axis=0)  # [T, 3]
        with np.errstate(invalid="ignore", divide="ignore"):
            share = (chosen[:, :, :3] - centre[None]) / scale[None, :, None]
        level = nanmedian(share, axis=1)  # [r, 3]
        if np.isnan(level).any():
            continue
        z, excess = _against_reference(level, ranks.node[members])
        noise = _level_error(share, level)
        out.judged[job] = list(members)
        out.z[job] = z
        found = []
        for row, index in enumerate(members):
            candidates = [
                (float(excess[row, k]), name)
                for k, name in ((0, "compute"), (1, "input"))
                if z[row, k] >= Z and excess[row, k] >= SHARE and excess[row, k] >= STEADY * noise[row, k]
            ]
            if not candidates:
                continue
            extra, kind = max(candidates)
            waits_less = -float(excess[row, 2])
            if waits_less < CORROBORATION * extra:
                continue  # it waits with the others: not what holds them back
            behind = [
                members[j]
                for j in range(len(members))
                if j != row and level[j, 2] - level[row, 2] >= WAITS * extra
            ]
            found.append(
                Culprit(
                    job,
                    ranks.rank[index],
                    index,
                    int(ranks.node[index]),
                    kind,
                    KINDS[kind],
                    extra,
                    float(z[row, 0 if kind == "compute" else 1]),
                    waits_less,
                    behind,
                    len(members),
                )
            )
        if found and _few(found, ranks.node[members]):
            out.culprits.extend(found)
    return out


def _level_error(share: np.ndarray, level: np.ndarray) -> np.ndarray:
    """[r, 3] the standard error of each rank's level (the median over its recent steps of its
    deviation from the job's median) were it as noisy as the job's ranks typically are: 1.2533 times
    the median over the ranks of their deviations' robust standard deviation step to step, over the
    square root of its steps. Pooled, so that a rank whose fault comes and goes (a stall on some
    steps) is not judged against its own swings.

    The normal-theory error of a median: steps taken as independent. Input waits are closer to
    lognormal and come in runs (prefetch queues), so a healthy rank's level passes STEADY errors
    more often than a normal tail says, the more so in a job of many ranks; and where one node holds
    much of a job (2 nodes of 8 ranks) its faulty ranks widen the pool. What the hold-out measured
    is with these limits (README "Synchronous jobs")."""
    steps = (~np.isnan(share)).sum(axis=1)
    spread = 1.4826 * nanmedian(np.abs(share - level[:, None, :]), axis=1)  # [r, 3]
    typical = np.median(spread, axis=0)  # [3]
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1.2533 * typical[None, :] / np.sqrt(steps)


def _against_reference(level: np.ndarray, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(z, excess) [r, 3] of a job's ranks' levels [r, 3], each against its reference: the ranks on
    other nodes and itself, where its node hosts others of the job and MIN_RANKS or more are left;
    else all the job's ranks (one rank a node: exactly the job's robust z)."""
    z = np.empty_like(level)
    excess = np.empty_like(level)
    for k in range(3):
        z[:, k], excess[:, k] = robust_z(level[:, k], FLOOR)
    hosts, count = np.unique(nodes, return_counts=True)
    for node in hosts[(count > 1) & (len(nodes) - count + 1 >= MIN_RANKS)]:
        rows = np.flatnonzero(nodes == node)
        others = level[nodes != node]
        # [its ranks, the others + itself, 3]: one reference per rank of the node
        reference = np.concatenate(
            [np.broadcast_to(others, (len(rows), *others.shape)), level[rows][:, None, :]], axis=1
        )
        centre = np.median(reference, axis=1)
        scale = np.maximum(1.4826 * np.median(np.abs(reference - centre[:, None, :]), axis=1), FLOOR)
        excess[rows] = level[rows] - centre
        z[rows] = excess[rows] / scale
    return z, excess


def _few(found: list[Culprit], nodes: np.ndarray) -> bool:
    """Culprits on at most a quarter of the job's nodes (at least one), and on each of those nodes
    all the job's ranks there or at most a quarter of them (at least one)."""
    job_nodes = Counter(nodes.tolist())
    on = Counter(c.node for c in found)
    if len(on) > max(1, len(job_nodes) // 4):
        return False
    return all(
        count == job_nodes[node] or count <= max(1, job_nodes[node] // 4) for node, count in on.items()
    )


def stands_out(
    x_norm: np.ndarray, mask: np.ndarray, groups: list[list[int]], counted: np.ndarray, recent: int = RECENT
) -> np.ndarray:
    """[N, F] bool: the node's recent level of the (counted) feature lies Z robust deviations (in
    normalised units, floor 0.5) and at least 1 std from the median of its group (its job's nodes,
    or the nodes behind its switch of its class and state); groups under MIN_RANKS judge no one."""
    seen = mask[:, -recent:, :] > 0
    values = np.where(seen, x_norm[:, -recent:, :], np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a feature a node never sent recently
        level = np.nanmean(values, axis=1).astype(np.float64)  # [N, F]
    out = np.zeros(level.shape, dtype=bool)
    for members in groups:
        if len(members) < MIN_RANKS:
            continue
        block = level[members]
        centre = nanmedian(block, axis=0)
        deviation = np.abs(block - centre)
        scale = np.maximum(1.4826 * np.nan_to_num(nanmedian(deviation, axis=0)), 0.5)
        with np.errstate(invalid="ignore"):
            out[members] |= (deviation / scale >= Z) & (deviation >= 1.0) & counted[None, :]
    return out
