"""Synchronous jobs over a fleet: the scenes the job-relative detector and the graphs are
measured on. A scene is a fleet of nodes behind switches (4-8 switches of 8-16 nodes), most of them
running jobs of 4-64 nodes (packed or scattered over the switches), the rest idle; a job runs one rank
a node, or where a family says so 2-8 (`Options.ranks_per_node`: an 8-GPU node runs 8), each rank on
its share of the node's GPUs;
10 minutes at 5 s, rows exactly as the stream's collector stores them (`Scene.to_rows`: the node
part with `agg`, the job part with `job` and `rank`, all `source=stream`), and the `nodes` table's
switch of each node (`Scene.topology`).

Each rank's step, collective and input times come from how a synchronous step runs: every rank
computes (its own GPU work, jitter shared by the job and its own), waits for its input, and then
waits in the collective for the last rank to arrive plus the transfer itself, so the step time is
the same on every rank. A straggler (a GPU) computes longer and the others wait for it; an input
stall (a node's disk or mount) makes every rank of one node wait for data, and the others wait for
them; congestion behind a switch lengthens the transfer
of every job crossing it, and the nodes behind it wait to transmit. Jobs start (slow first steps),
end, restart (a gap, then slow steps again), checkpoint (all ranks, or rank 0 alone while the
others wait), and some report their step time only. The node part (GPU temperature, power, clocks,
utilisation, IB, RDMA, AER, NVMe) is the episode generator's healthy node (families.healthy_window,
calibrated on the real H200 capture) with each node's transmit waits set by its job's traffic.

numpy only and deterministic for a seed; no ONNX, no store."""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stethoscope.model.features import Windows
from stethoscope.model.metadata import FEATURES, STEP_SECONDS, STEPS
from stethoscope.model.path import Place
from stethoscope.model.ranks import TIMES, Ranks
from stethoscope_training.episodes import STREAM_CARRY, carry
from stethoscope_training.families import GPUS, F, Hardware, healthy_window

SIZES = (4, 8, 16, 32, 64)
SIZE_WEIGHTS = (0.3, 0.3, 0.2, 0.13, 0.07)
KINDS = ("healthy", "straggler", "input_stall", "switch_congestion")
LAYER = {"straggler": "compute", "input_stall": "storage", "switch_congestion": "communication"}
NODE_FEATURES = [i for i, f in enumerate(FEATURES) if not f.metric.startswith("train_")]
JOB_FEATURES = [F[name] for name in TIMES]
XMIT = F["ib_port_xmit_wait_per_second"]
STEP_ONLY_SHARE = 0.1
IMPACT = 1.05  # the jobs' step 5 % slower than before the onset, 3 steps running: the impact


@dataclass
class Job:
    name: str
    nodes: list[int]  # rank r runs on nodes[r // per_node]
    active: np.ndarray  # [T] bool
    step_ms: float
    comm_share: float
    data_share: float
    noise: float
    step_only: bool
    warm: np.ndarray  # [T] float >= 1: slow first steps after a start or a restart
    checkpoint: tuple[int, int, str] | None  # (step, length, "rank0" or "all")
    stages: np.ndarray | None = None  # [ranks] compute factor of a pipeline stage (healthy variety)
    per_node: int = 1  # ranks a node

    @property
    def ranks(self) -> int:
        return len(self.nodes) * self.per_node


@dataclass
class Scene:
    family: str
    kind: str
    node_ids: list[str]
    switch: list[str]
    hw_class: str
    values: np.ndarray  # float32 [N, T, F]: each node's reading at each step (NaN: none)
    seen: np.ndarray  # bool [N, T, F]: sent at that step
    job: list[str]  # [N] the node's job ("" idle)
    rank_job: list[str]
    rank_label: list[str]
    rank_node: np.ndarray  # [R]
    rank_values: np.ndarray  # float32 [R, T, 3] (ranks.TIMES)
    rank_seen: np.ndarray  # bool [R, T, 3]
    truth: dict[str, Any] = field(default_factory=dict)

    @property
    def topology(self) -> dict[str, Place]:
        return {node: Place(switch, switch) for node, switch in zip(self.node_ids, self.switch, strict=True)}

    def windows(self, end: int | None = None) -> Windows:
        """What features.read_windows returns for this scene's rows. `end`: the scene up to that step
        only (a shorter window, for the detectors, which read its first and last steps: measuring
        when a fault is first seen)."""
        end = self.values.shape[1] if end is None else end
        x, mask = carry(self.values[:, :end], self.seen[:, :end], STREAM_CARRY)
        rx, rmask = carry(self.rank_values[:, :end], self.rank_seen[:, :end], STREAM_CARRY)
        sent = np.asarray(self.seen[:, :, NODE_FEATURES].any(axis=2))  # [N, T]: a node-part sample
        streamed = np.asarray(sent[:, :end].any(axis=1)).tolist()
        current = np.asarray(sent[:, max(0, end - 5) : end].any(axis=1)).tolist()  # in the last 25 s
        ranks = Ranks(list(self.rank_job), list(self.rank_label), self.rank_node.copy(), rx, rmask)
        return Windows(
            list(self.node_ids),
            x,
            mask,
            [self.hw_class] * len(self.node_ids),
            self._jobs_until(end),
            streamed,
            current,
            ranks,
        )

    def _jobs_until(self, end: int) -> list[str]:
        """Each node's job as read_windows names it: the job of its newest job-part row."""
        out = [""] * len(self.node_ids)
        last = np.full(len(self.node_ids), -1)
        for r, node in enumerate(self.rank_node):
            sent = np.flatnonzero(self.rank_seen[r, :end].any(axis=1))
            if len(sent) and sent[-1] >= last[node]:
                last[node], out[node] = sent[-1], self.rank_job[r]
        return out

    def to_rows(self, end_ms: int) -> list[dict]:
        """The rows the collector stores for this scene, its last step ending at end_ms; each series
        sends at a phase of its own, 0.5-4.5 s before its step's end."""
        rows = []
        steps = self.values.shape[1]
        for n, node in enumerate(self.node_ids):
            phase = _phase(node)
            for k, f in zip(*np.nonzero(self.seen[n][:, NODE_FEATURES]), strict=True):
                feature = FEATURES[NODE_FEATURES[f]]
                rows.append(
                    {
                        "node_id": node,
                        "metric_name": feature.metric,
                        "device": "node",
                        "labels": {"source": "stream", "agg": feature.agg},
                        "value": float(self.values[n, k, NODE_FEATURES[f]]),
                        "timestamp": end_ms - (steps - 1 - int(k)) * STEP_SECONDS * 1000 - phase,
                    }
                )
        for r, node_index in enumerate(self.rank_node):
            node = self.node_ids[int(node_index)]
            labels = {"source": "stream", "job": self.rank_job[r], "rank": self.rank_label[r]}
            phase = _phase(f"{node}/{self.rank_job[r]}/{self.rank_label[r]}")
            for k, c in zip(*np.nonzero(self.rank_seen[r]), strict=True):
                rows.append(
                    {
                        "node_id": node,
                        "metric_name": TIMES[int(c)],
                        "device": "job",
                        "labels": dict(labels),
                        "value": float(self.rank_values[r, k, c]),
                        "timestamp": end_ms - (steps - 1 - int(k)) * STEP_SECONDS * 1000 - phase,
                    }
                )
        return rows

    def nodes_rows(self, updated_ms: int) -> list[dict]:
        """The `nodes` table's rows (inventory: rack and switch of each node)."""
        return [
            {
                "node_id": node,
                "slurm_name": node,
                "rack": switch,
                "switch": switch,
                "groups": [],
                "updated_at": updated_ms,
            }
            for node, switch in zip(self.node_ids, self.switch, strict=True)
        ]


def _phase(key: str) -> int:
    return 500 + int(hashlib.sha256(key.encode()).hexdigest()[:6], 16) % 4000


# --- the fleet --------------------------------------------------------------------------------------


@dataclass
class Options:
    """What a family varies (job_families.py, job_fresh.py)."""

    switches: tuple[int, int] = (4, 8)
    per_switch: tuple[int, ...] = (8, 12, 16)
    sizes: tuple[int, ...] = SIZES  # a job's nodes
    ranks_per_node: tuple[int, int] = (1, 1)  # each job's ranks a node, drawn from this range
    size_weights: tuple[float, ...] = SIZE_WEIGHTS
    idle: tuple[float, float] = (0.05, 0.2)
    lifecycle: float = 0.3  # share of jobs that start, end or restart in the window
    checkpoint: float = 0.3
    step_only: float = STEP_ONLY_SHARE
    pipeline: float = 0.0  # share of jobs whose ranks compute in pipeline stages of unequal length
    packed: float = 0.7  # share of jobs placed on the scheduler's next free block (else scattered)
    data_share: tuple[float, float] = (0.003, 0.05)  # of the step, waiting for input
    data_sigma: float = 0.3  # how much the input wait varies from step to step (lognormal)
    bursts: bool = False  # a switch's traffic comes in short spells (a healthy neighbour's all-to-all)
    prefix: str = ""  # of node and switch names, so that scenes can be put side by side in one store
    job_ids: tuple[int, int] = (1000, 99999)  # the range job ids are drawn from (scenes side by side)
    # a fault: its severity range, onset range and shape
    severity: tuple[float, float] = (0.0, 0.0)
    onset: tuple[int, int] = (20, 96)
    ramp: tuple[int, int] = (1, 10)
    duty: tuple[float, float] = (1.0, 1.0)  # share of steps the fault is on after its onset
    fault_job_sizes: tuple[int, ...] = SIZES
    hot_culprit: bool = False  # the straggler's GPUs also run hot and clock lower
    congestion_impact: tuple[float, float] = (0.3, 2.5)  # the transfers' slowdown at full congestion
    waits: tuple[float, float] = (3.0, 40.0)  # how many times as long the waits behind it get


def _layout(rng: np.random.Generator, options: Options) -> tuple[list[str], list[str], list[list[int]]]:
    switches = int(rng.integers(options.switches[0], options.switches[1] + 1))
    per = int(rng.choice(options.per_switch))
    count = switches * per
    node_ids = [f"{options.prefix}n{i:03d}" for i in range(count)]
    switch = [f"{options.prefix}leaf{i // per}" for i in range(count)]
    idle_target = int(count * rng.uniform(*options.idle))
    order = list(np.roll(np.arange(count), int(rng.integers(0, count))))
    free = list(order)
    jobs: list[list[int]] = []
    weights = np.asarray(options.size_weights, float) / np.sum(options.size_weights)
    while len(free) > idle_target:
        size = int(rng.choice(options.sizes, p=weights))
        if size > len(free) - idle_target:
            fitting = [s for s in options.sizes if s <= len(free) - idle_target]
            if not fitting:
                break
            size = max(fitting)
        if rng.random() < options.packed:  # the scheduler's next free block
            nodes, free = free[:size], free[size:]
        else:
            picked = set(rng.choice(len(free), size=size, replace=False).tolist())
            nodes = [free[i] for i in sorted(picked)]
            free = [node for i, node in enumerate(free) if i not in picked]
        jobs.append([int(n) for n in rng.permutation(nodes)])
    return node_ids, switch, jobs


def _job(rng: np.random.Generator, name: str, nodes: list[int], options: Options, steady: bool) -> Job:
    t = np.arange(STEPS)
    active = np.ones(STEPS, dtype=bool)
    warm = np.ones(STEPS)
    if not steady and rng.random() < options.lifecycle:
        what = rng.choice(["start", "end", "restart"])
        if what == "start":
            first = int(rng.integers(10, 80))
            active = t >= first
            warm = _warm(rng, first, warm)
        elif what == "end":
            active = t < int(rng.integers(40, 110))
        else:
            gap, length = int(rng.integers(20, 90)), int(rng.integers(2, 10))
            active = (t < gap) | (t >= gap + length)
            warm = _warm(rng, gap + length, warm)
    checkpoint = None
    if rng.random() < options.checkpoint:
        checkpoint = (
            int(rng.integers(0, STEPS - 4)),
            int(rng.integers(1, 5)),
            str(rng.choice(["rank0", "all"])),
        )
    low, high = options.ranks_per_node
    per_node = low if low == high else int(rng.integers(low, high + 1))  # (one rank a node: no draw)
    ranks = len(nodes) * per_node
    stages = None
    if rng.random() < options.pipeline and ranks >= 8:
        count = int(rng.choice([2, 4]))
        factors = 1 + rng.uniform(-0.08, 0.08, count)
        stages = factors[np.arange(ranks) * count // ranks]
    return Job(
        name,
        nodes,
        active,
        float(10 ** rng.uniform(np.log10(150), np.log10(3000))),
        float(rng.uniform(0.05, 0.35)),
        float(rng.uniform(*options.data_share)),
        float(rng.uniform(0.5, 2.0)),
        (not steady) and rng.random() < options.step_only,
        warm,
        checkpoint,
        stages,
        per_node,
    )


def _warm(rng: np.random.Generator, first: int, warm: np.ndarray) -> np.ndarray:
    length = int(rng.integers(2, 9))
    factor = rng.uniform(1.5, 4.0)
    steps = np.arange(STEPS) - first
    inside = (steps >= 0) & (steps < length)
    return np.where(inside, 1 + (factor - 1) * (1 - steps / length), warm)


@dataclass
class Fault:
    kind: str
    onset: int = -1
    job: int = -1  # index into jobs
    rank: int = -1
    switch: str = ""
    gate: np.ndarray = field(default_factory=lambda: np.zeros(STEPS))  # [T] 0..1 how much of it is on
    severity: float = 0.0


def _fault(
    rng: np.random.Generator, kind: str, options: Options, jobs: list[Job], switch: list[str], steady: int
) -> Fault:
    if kind == "healthy":
        return Fault(kind)
    onset = int(rng.integers(*options.onset))
    ramp = max(1, int(rng.integers(options.ramp[0], options.ramp[1] + 1)))
    gate = np.clip((np.arange(STEPS) - onset + 1) / ramp, 0.0, 1.0)
    duty = rng.uniform(*options.duty)
    if duty < 1.0:
        on = rng.random(STEPS) < duty
        gate = gate * on
    severity = float(rng.uniform(*options.severity))
    if kind == "switch_congestion":
        busy: dict[str, int] = {}  # congestion needs traffic: nodes whose job runs to the end
        for job in jobs:
            for node in job.nodes if job.active[-24:].all() else ():
                busy[switch[node]] = busy.get(switch[node], 0) + 1
        candidates = sorted(name for name, count in busy.items() if count >= 4) or sorted(busy)
        return Fault(kind, onset, switch=str(rng.choice(candidates)), gate=gate, severity=severity)
    rank = int(rng.integers(0, jobs[steady].ranks))
    return Fault(kind, onset, steady, rank, gate=gate, severity=severity)


def _times(
    rng: np.random.Generator, job: Job, fault: Fault, index: int, congestion: np.ndarray, sigma: float
):
    """[ranks, T] each rank's step, collective and input times (ms), and how long it waited for the
    others in the collective (its collective time less the transfer)."""
    ranks = job.ranks
    shape = (ranks, STEPS)
    n = job.noise
    compute_ms = job.step_ms * (1 - job.comm_share - job.data_share)
    shared = rng.normal(0, 0.02 * n, STEPS)
    own = rng.normal(0, 0.006, (ranks, 1)) + rng.normal(0, 0.004 * n, shape)
    compute = compute_ms * (1 + shared[None, :] + own) * job.warm[None, :]
    if job.stages is not None:
        compute = compute * job.stages[:, None]
    data = job.step_ms * job.data_share * rng.lognormal(0, sigma, shape) * job.warm[None, :] ** 1.5
    transfer = job.step_ms * job.comm_share * (1 + rng.normal(0, 0.03 * n, STEPS)) * congestion
    if job.checkpoint is not None:
        start, length, who = job.checkpoint
        during = np.zeros(STEPS, dtype=bool)
        during[start : start + length] = True
        pause = job.step_ms * rng.uniform(2, 10)
        if who == "rank0":
            compute[0] = compute[0] + during * pause
        else:
            compute = compute + during[None, :] * pause
    if fault.job == index and fault.kind == "straggler":
        compute[fault.rank] *= 1 + fault.severity * fault.gate
    if fault.job == index and fault.kind == "input_stall":  # every rank of the node waits for it
        stall = job.step_ms * fault.severity * rng.lognormal(0, 0.3, STEPS)
        mates = _mates(job, fault.rank)
        data[mates] = data[mates] + stall * fault.gate
    arrival = compute + data
    step = arrival.max(axis=0) + transfer
    comm = step[None, :] - arrival
    times = np.stack([np.broadcast_to(step, shape), comm, data], axis=2)
    return times * (1 + rng.normal(0, 0.002, times.shape)), comm - transfer[None, :]


def simulate(
    rng: np.random.Generator, hw: Hardware, kind: str, family: str, options: Options | None = None
) -> Scene:
    """One scene of `kind` (KINDS)."""
    options = options or Options()
    node_ids, switch, placed = _layout(rng, options)
    count = len(node_ids)
    # Slurm's numeric job ids, which the wire carries as themselves (wire.job_field)
    names = [str(n) for n in rng.choice(np.arange(*options.job_ids), size=len(placed), replace=False)]
    steady = -1  # the job a rank fault hits runs the whole window and sends all its times
    if kind in ("straggler", "input_stall"):
        fitting = [i for i, nodes in enumerate(placed) if len(nodes) in options.fault_job_sizes]
        steady = int(rng.choice(fitting or list(range(len(placed)))))
    jobs = [
        _job(rng, name, nodes, options, i == steady)
        for i, (name, nodes) in enumerate(zip(names, placed, strict=True))
    ]
    fault = _fault(rng, kind, options, jobs, switch, steady)
    behind = np.array([s == fault.switch for s in switch]) if fault.switch else np.zeros(count, bool)
    final = rng.uniform(*options.waits)
    waits = 1 + (final - 1) * fault.gate if fault.switch else np.ones(STEPS)
    knee = 1 + 0.3 * (final - 1)  # the transfers slow down once the waits pass this
    slowdown = rng.uniform(*options.congestion_impact) * np.clip((waits - knee) / (final - knee), 0, 1)

    busy = np.zeros((count, STEPS))
    job_of = [""] * count
    rank_job, rank_label, rank_node, rank_values, rank_sent, waited = [], [], [], [], [], []
    rank_gpus = []  # each rank's share of its node's GPUs
    crossing = []
    for index, job in enumerate(jobs):
        crosses = bool(fault.switch) and bool(behind[job.nodes].any())
        if crosses:
            crossing.append(job.name)
        congestion = 1 + slowdown if crosses else np.ones(STEPS)
        times, wait = _times(rng, job, fault, index, congestion, options.data_sigma)
        for r in range(job.ranks):
            node = job.nodes[r // job.per_node]
            busy[node] = job.active
            job_of[node] = job.name
            rank_gpus.append(np.array_split(np.arange(GPUS), job.per_node)[r % job.per_node])
            rank_job.append(job.name)
            rank_label.append(str(r))
            rank_node.append(node)
            rank_values.append(times[r])
            waited.append(wait[r] / times[r, :, 0])
            sent = np.repeat(job.active[:, None], 3, axis=1)
            sent[:, 1:] &= not job.step_only
            rank_sent.append(sent)
    w = healthy_window(rng, hw, count, busy)
    values = w.node.astype(np.float64)
    for job in jobs:  # a job's traffic sets its nodes' transmit waits
        level = 10 ** rng.uniform(3, 5)
        spread = rng.lognormal(0, 0.3, len(job.nodes))
        for r, node in enumerate(job.nodes):
            load = level * spread[r] * rng.lognormal(0, 0.25 * float(w.noise[node, 0]), STEPS)
            values[node, :, XMIT] = np.where(job.active, load, values[node, :, XMIT])
    values[:, :, XMIT] = np.rint(values[:, :, XMIT] * np.where(behind[:, None], waits[None, :], 1.0))
    if options.bursts:
        _spells(rng, values, switch)
    if kind == "straggler" and options.hot_culprit:
        _hot(rng, w, hw, _node_of(jobs[fault.job], fault.rank), fault)
    for r, node in enumerate(rank_node):  # a rank waiting for its peers idles its GPUs meanwhile
        share = (1 - np.clip(waited[r], 0, 0.9))[:, None]
        on = busy[node][:, None] > 0
        gpus = rank_gpus[r]
        util, power = w.util[node][:, gpus], w.power[node][:, gpus]
        w.util[node][:, gpus] = np.where(on, np.rint(util * (0.5 + 0.5 * share)), util)
        w.power[node][:, gpus] = np.where(
            on, hw.idle_power + (power - hw.idle_power) * (0.6 + 0.4 * share), power
        )
    values[:, :, F["gpu_temperature_celsius"]] = w.temp.max(axis=2)
    values[:, :, F["gpu_power_watts"]] = np.round(w.power.sum(axis=2), 2)
    values[:, :, F["gpu_sm_clock_mhz"]] = w.clock.min(axis=2)
    values[:, :, F["gpu_utilization_percent"]] = w.util.mean(axis=2)

    loss = rng.choice([0.0, 0.003, 0.01, 0.03], count)
    node_seen = rng.random((count, STEPS)) >= loss[:, None]
    quiet = rng.random(count) < 0.03  # now and then a node goes quiet for a while
    t = np.arange(STEPS)[None, :]
    gap_start, gap_len = rng.integers(0, STEPS, (count, 1)), rng.integers(4, 30, (count, 1))
    node_seen &= ~(quiet[:, None] & (t >= gap_start) & (t < gap_start + gap_len))
    nodes_of_ranks = np.asarray(rank_node, np.int64)
    rank_seen = np.asarray(rank_sent, bool)
    rank_seen &= (rng.random(rank_seen.shape[:2]) >= loss[nodes_of_ranks][:, None])[:, :, None]
    ranks_x = np.where(rank_seen, np.asarray(rank_values), np.nan).astype(np.float32)
    seen = np.zeros(values.shape, bool)
    seen[:, :, NODE_FEATURES] = node_seen[:, :, None]
    values[:, :, JOB_FEATURES] = np.nan
    for r, node in enumerate(rank_node):  # the node's job features: its ranks', max (as read_windows)
        values[node][:, JOB_FEATURES] = np.fmax(values[node][:, JOB_FEATURES], ranks_x[r])
        seen[node][:, JOB_FEATURES] |= rank_seen[r]
    values = np.where(seen, values, np.nan).astype(np.float32)  # the wire carries float32
    truth = _truth(kind, fault, jobs, ranks_x, rank_job, crossing)
    return Scene(
        family,
        kind,
        node_ids,
        switch,
        hw.hw_class,
        values,
        seen,
        job_of,
        rank_job,
        rank_label,
        nodes_of_ranks,
        ranks_x,
        rank_seen,
        truth,
    )


def _node_of(job: Job, rank: int) -> int:
    return job.nodes[rank // job.per_node]


def _mates(job: Job, rank: int) -> list[int]:
    """The ranks of the job on the rank's node, itself included."""
    first = rank // job.per_node * job.per_node
    return list(range(first, first + job.per_node))


def _spells(rng: np.random.Generator, values: np.ndarray, switch: list[str]) -> None:
    """Short spells (1-3 steps, every ~10) of heavy traffic behind one switch: waits 3-20 times."""
    chosen = str(rng.choice(sorted(set(switch))))
    on = np.zeros(STEPS, dtype=bool)
    t = int(rng.integers(0, 10))
    while t < STEPS:
        on[t : t + int(rng.integers(1, 4))] = True
        t += int(rng.integers(6, 16))
    factor = np.where(on, rng.uniform(3, 20), 1.0)
    behind = np.array([s == chosen for s in switch])
    values[behind, :, XMIT] = np.rint(values[behind, :, XMIT] * factor[None, :])


def _hot(rng: np.random.Generator, w, hw: Hardware, node: int, fault: Fault) -> None:
    """A straggler whose GPUs also run hot and clock lower (a failing fan, a blocked inlet)."""
    gpus = rng.random(GPUS) < 0.3
    gpus[int(rng.integers(0, GPUS))] = True
    heat = fault.gate * rng.uniform(8, 20)
    w.temp[node] = np.rint(w.temp[node] + np.where(gpus[None, :], heat[:, None], 0))
    slower = np.where(gpus[None, :], 1 - 0.5 * fault.severity * fault.gate[:, None], 1)
    w.clock[node] = hw.clock_step * np.rint(w.clock[node] * slower / hw.clock_step)


def _truth(kind: str, fault: Fault, jobs: list[Job], rank_values, rank_job, crossing) -> dict[str, Any]:
    truth: dict[str, Any] = {"kind": kind, "layer": LAYER.get(kind, ""), "onset": fault.onset}
    if kind in ("straggler", "input_stall"):
        job = jobs[fault.job]
        node = _node_of(job, fault.rank)
        truth.update(
            job=job.name,
            rank=str(fault.rank),
            # the culprit ranks: the straggler, or every rank of the stalled node
            ranks=[str(r) for r in (_mates(job, fault.rank) if kind == "input_stall" else [fault.rank])],
            node=node,
            peers=[n for n in job.nodes if n != node],
            severity=fault.severity,
        )
    elif kind == "switch_congestion":
        truth.update(switch=fault.switch, crossing=sorted(crossing), severity=fault.severity)
        truth["impact"] = _impact(rank_values, rank_job, crossing, fault.onset)
    return truth


def _impact(rank_values: np.ndarray, rank_job: list[str], crossing: list[str], onset: int) -> int:
    """The first step from which some crossing job's step time stays 5 % over its level before the
    onset for 3 steps (-1: not within the window)."""
    first = STEPS
    for name in crossing:
        members = [r for r, job in enumerate(rank_job) if job == name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # a step none of its ranks sent
            step = np.nanmedian(rank_values[members, :, 0], axis=0)
            before = np.nanmedian(step[:onset]) if onset > 0 else np.nan
        if not np.isfinite(before):
            continue
        slow = np.nan_to_num(step, nan=0.0) >= IMPACT * before
        for t in range(onset, STEPS - 2):
            if slow[t : t + 3].all():
                first = min(first, t)
                break
    return first if first < STEPS else -1


Family = Callable[[np.random.Generator, Hardware], Scene]
