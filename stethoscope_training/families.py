"""The generator's signals (stethoscope_training.episodes): an 8-GPU node of one hardware class,
built per GPU then aggregated as the stream's node part aggregates them, and the families that
change it: healthy ones calibrated on the real H200 capture (package data, stethoscope/data/
h200-vm-under-load, a copy of the test fixture of that name: idle ~79 W at 345 MHz and 35 C; under
load the power cap holds it at ~690 W, ~1440 MHz, 57-59 C, and that is healthy) and faulted ones
that start healthy and change at an onset step, by a severity in [0, 1], with the episode's own
noise level."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stethoscope.model.metadata import FEATURES, STEP_SECONDS, STEPS
from stethoscope.paths import data_dir, h200_capture

GPUS = 8
# as the episodes record it: relative to the package data
CAPTURE = h200_capture().relative_to(data_dir().parent.parent)
F = {f.metric: i for i, f in enumerate(FEATURES)}


class EpisodesError(ValueError):
    """Missing or damaged episodes (a configuration error, exit 2)."""


@dataclass(frozen=True)
class Hardware:
    """Per-GPU operating ranges of one hardware class."""

    hw_class: str  # what features.read_windows reports for such a node (the class's GPU model)
    idle_power: float
    idle_clock: float
    max_clock: float
    cap_power: float  # sustained load sits here (the power cap)
    load_clock: float  # SM clock at the cap
    clock_step: float  # clocks move in these steps
    idle_temp: float
    load_temp: float


def _capture_rows(path: Path | None = None) -> np.ndarray:
    """The capture's (temperature, power, sm clock, utilisation) per 0.5-s sample."""
    if path is None:  # the package's copy
        path = h200_capture()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()[1:]
    except OSError as exc:
        raise EpisodesError(f"{path}: cannot read the H200 capture: {exc}") from None
    rows = []
    for number, line in enumerate(lines, start=2):
        cells = [c.strip() for c in line.split(",")]
        try:
            rows.append([float(cells[i].split()[0]) for i in (2, 4, 5, 7)])
        except (IndexError, ValueError):
            raise EpisodesError(f"{path}:{number}: not a --query-gpu row") from None
    return np.asarray(rows, dtype=np.float64)


@dataclass(frozen=True)
class Capture:
    idle: np.ndarray  # samples at rest, (temp, power, clock, util)
    load: np.ndarray  # samples under sustained load (at the power cap)

    @classmethod
    def read(cls, path: Path | None = None) -> Capture:
        rows = _capture_rows(path)
        idle = rows[(rows[:, 3] == 0) & (rows[:, 1] < 90)]
        load = rows[(rows[:, 3] >= 99) & (rows[:, 1] > 0.9 * rows[:, 1].max())]
        return cls(idle, load)

    def h200(self) -> Hardware:
        return Hardware(
            hw_class="NVIDIA H200",
            idle_power=float(np.median(self.idle[:, 1])),
            idle_clock=float(np.median(self.idle[:, 2])),
            max_clock=1980.0,
            cap_power=float(np.median(self.load[:, 1])),
            load_clock=float(np.median(self.load[:, 2])),
            clock_step=15.0,
            idle_temp=float(np.median(self.idle[:, 0])),
            load_temp=float(np.median(self.load[:, 0])),
        )


def shifted(h200: Hardware) -> Hardware:
    """A later generation: ~1000 W at its cap, a higher sustained clock, runs cooler at rest."""
    return Hardware(
        hw_class="synthetic next-gen",
        idle_power=145.0,
        idle_clock=600.0,
        max_clock=1980.0,
        cap_power=1000.0,
        load_clock=1830.0,
        clock_step=15.0,
        idle_temp=30.0,
        load_temp=66.0,
    )


# --- the node's signals, built per GPU then aggregated as the node part aggregates them ---------


@dataclass
class Window:
    """n episodes of one family while being built: per-GPU signals, node signals, job signals."""

    rng: np.random.Generator
    hw: Hardware
    n: int
    temp: np.ndarray  # [n, T, G]
    power: np.ndarray
    clock: np.ndarray
    util: np.ndarray
    node: np.ndarray  # [n, T, 12]: the non-GPU node features (aer, ib, rdma, xmit, disk)
    job: np.ndarray  # [n, T] bool: a job runs (train_ metrics exist)
    busy: np.ndarray  # [n, T] float 0..1: load on the GPUs
    noise: np.ndarray  # [n, 1] per-episode noise multiplier
    step_ms: np.ndarray  # [n, T]: job metrics
    comm_ms: np.ndarray
    data_ms: np.ndarray
    onset: np.ndarray  # [n] int
    severity: np.ndarray  # [n] float

    def after(self, ramp: np.ndarray | float = 1.0) -> np.ndarray:
        """[n, T] 0 before the onset, rising to 1 over `ramp` steps after it."""
        t = np.arange(STEPS)[None, :]
        ramp = np.maximum(np.broadcast_to(np.asarray(ramp, dtype=float), (self.n,)), 1.0)[:, None]
        return np.clip((t - self.onset[:, None] + 1) / ramp, 0.0, 1.0)


def healthy_window(rng: np.random.Generator, hw: Hardware, n: int, busy: np.ndarray) -> Window:
    """Healthy signals of n nodes whose GPU load follows busy [n, T] (0 idle, 1 training)."""
    T, G = STEPS, GPUS
    noise = rng.uniform(0.5, 2.0, (n, 1))
    nz = noise[:, :, None]
    b = busy[:, :, None]
    # GPU temperature approaches its load level within a step or two and falls back more slowly
    gpu_offset = rng.normal(0.0, 1.5, (n, 1, G))  # where a GPU sits in the airflow
    target = hw.idle_temp + gpu_offset * 0.5 + b * (hw.load_temp - hw.idle_temp + gpu_offset)
    temp = np.empty((n, T, G))
    temp[:, 0] = target[:, 0]
    for t in range(1, T):
        rate = np.where(target[:, t] > temp[:, t - 1], 0.7, 0.35)
        temp[:, t] = temp[:, t - 1] + rate * (target[:, t] - temp[:, t - 1])
    temp = np.rint(temp + rng.normal(0, 0.3, (n, T, G)) * nz)
    idle_power = hw.idle_power * (1 + rng.normal(0, 0.004, (n, T, G)) * nz)
    blip = rng.random((n, T, G)) < 0.02  # the driver's short boosts at rest (98-118 W in the capture)
    idle_power = np.where(blip, idle_power * rng.uniform(1.2, 1.5, (n, T, G)), idle_power)
    load_power = hw.cap_power + rng.normal(0, 1.4, (n, T, G)) * nz
    power = idle_power + b * (load_power - idle_power)
    idle_clock = np.where(blip, hw.idle_clock + 4 * hw.clock_step, hw.idle_clock)
    load_clock = hw.load_clock + rng.normal(0, 20, (n, T, G)) * nz
    clock = hw.clock_step * np.rint((idle_clock + b * (load_clock - idle_clock)) / hw.clock_step)
    clock = np.minimum(clock, hw.max_clock)
    job_util = rng.uniform(95, 100, (n, 1, 1))
    util = np.clip(np.rint(b * (job_util + rng.normal(0, 1.0, (n, T, G)) * nz)), 0, 100)

    node = np.zeros((n, T, len(FEATURES)))
    for name, p in (
        ("pcie_aer_correctable_errors_per_second", 0.004),
        ("ib_symbol_errors_per_second", 0.002),
        ("rdma_qps_dropped_per_second", 0.004),
    ):  # a healthy node sees a stray error now and then: one or two in a 5-s period
        node[:, :, F[name]] = (rng.random((n, T)) < p) * rng.integers(1, 3, (n, T)) / STEP_SECONDS
    wait_level = 10 ** rng.uniform(3, 5, (n, 1))
    idle_wait = rng.uniform(0, 60, (n, T))
    load_wait = wait_level * rng.lognormal(0, 0.25 * noise, (n, T))
    node[:, :, F["ib_port_xmit_wait_per_second"]] = np.rint(idle_wait + busy * (load_wait - idle_wait))
    disk = rng.uniform(30, 44, (n, 1)) + busy * rng.uniform(2, 5, (n, 1))
    node[:, :, F["disk_temperature_celsius"]] = np.rint(disk + rng.normal(0, 0.35, (n, T)) * noise)

    step = 10 ** rng.uniform(np.log10(40), np.log10(4000), (n, 1))
    comm_share = rng.uniform(0.04, 0.4, (n, 1))
    data_share = rng.uniform(0.003, 0.06, (n, 1))
    jitter = rng.normal(0, 0.02, (n, T)) * noise
    step_ms = step * (1 + jitter)
    checkpoint = rng.random((n, T)) < 0.01  # a checkpoint or evaluation step now and then
    step_ms = np.where(checkpoint, step_ms * rng.uniform(1.3, 2.5, (n, T)), step_ms)
    comm_ms = step * comm_share * (1 + rng.normal(0, 0.05, (n, T)) * noise)
    data_ms = step * data_share * rng.lognormal(0, 0.3, (n, T))
    return Window(
        rng,
        hw,
        n,
        temp,
        power,
        clock,
        util,
        node,
        busy > 0.5,
        busy,
        noise,
        step_ms,
        comm_ms,
        data_ms,
        np.full(n, -1),
        np.zeros(n),
    )


def step_slower(w: Window, extra_ms: np.ndarray) -> None:
    """A step that takes extra_ms [n, T] longer: the GPUs wait that share of the step."""
    before = w.step_ms.copy()
    w.step_ms = w.step_ms + extra_ms
    share = (before / w.step_ms)[:, :, None]
    w.util = np.rint(w.util * share)
    w.power = w.hw.idle_power + (w.power - w.hw.idle_power) * (0.4 + 0.6 * share)


def collectives_slower(w: Window, extra: np.ndarray) -> None:
    """The job's collectives take extra_ms [n, T] longer, and so its step."""
    w.comm_ms = w.comm_ms + extra
    step_slower(w, extra)


def input_slower(w: Window, extra: np.ndarray) -> None:
    """The job waits extra_ms [n, T] longer for its input, and so its step."""
    w.data_ms = w.data_ms + extra
    step_slower(w, extra)


def port_waits_longer(w: Window, factor: np.ndarray) -> None:
    """The IB port waits to send `factor` [n, T] times as long."""
    xmit = w.node[:, :, F["ib_port_xmit_wait_per_second"]]
    w.node[:, :, F["ib_port_xmit_wait_per_second"]] = np.rint(xmit * factor)


def busy_pattern(rng: np.random.Generator, n: int, kind: str) -> np.ndarray:
    t = np.arange(STEPS)[None, :]
    if kind == "idle":
        return np.zeros((n, STEPS))
    if kind == "load":
        return np.ones((n, STEPS))
    edge = rng.integers(10, STEPS - 10, (n, 1))
    start = rng.random((n, 1)) < 0.5
    return np.where(start, t >= edge, t < edge).astype(float)


# --- families: each takes a healthy window and its rng, returns the window and onset/severity -------


def healthy_idle(rng, hw, n):
    return healthy_window(rng, hw, n, busy_pattern(rng, n, "idle"))


def healthy_training(rng, hw, n):
    return healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))


def healthy_power_capped(rng, hw, n):
    """An administrator's lower power limit: flat power at the limit, lower clocks, a slower step."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    limit = rng.uniform(0.6, 0.9, (n, 1, 1))
    w.power = w.hw.cap_power * limit + (w.power - w.hw.cap_power)
    clock = w.hw.load_clock * limit**0.7 + (w.clock - w.hw.load_clock)
    w.clock = w.hw.clock_step * np.rint(clock / w.hw.clock_step)
    w.step_ms = w.step_ms / limit[:, :, 0] ** 0.7
    w.comm_ms = w.comm_ms / limit[:, :, 0] ** 0.3
    w.temp = np.rint(w.hw.idle_temp + (w.temp - w.hw.idle_temp) * limit)
    return w


def healthy_transition(rng, hw, n):
    """A job starts (with slow first steps: compilation, warm-up) or ends inside the window."""
    busy = busy_pattern(rng, n, "edge")
    w = healthy_window(rng, hw, n, busy)
    t = np.arange(STEPS)[None, :]
    first = np.argmax(busy > 0.5, axis=1)[:, None]
    started = busy[:, :1] < 0.5
    warm = started & (t >= first) & (t < first + rng.integers(2, 8, (n, 1)))
    w.step_ms = np.where(warm, w.step_ms * rng.uniform(1.5, 4.0, (n, 1)), w.step_ms)
    w.data_ms = np.where(warm, w.data_ms * rng.uniform(2, 8, (n, 1)), w.data_ms)
    return w


def fault_onsets(w: Window, low: int = 20, high: int = 100) -> Window:
    w.onset = w.rng.integers(low, high, w.n)
    w.severity = w.rng.uniform(0.15, 1.0, w.n)
    return w


def severity_of(w: Window) -> np.ndarray:
    return w.severity[:, None]


def burst_steps(w: Window, on: float, off: float) -> np.ndarray:
    """[n, T] 0/1: bursts of ~on steps every ~off steps."""
    state = np.zeros((w.n, STEPS))
    p_start, p_stop = 1.0 / off, 1.0 / on
    current = np.zeros(w.n, dtype=bool)
    draws = w.rng.random((w.n, STEPS))
    for t in range(STEPS):
        current = np.where(current, draws[:, t] >= p_stop, draws[:, t] < p_start)
        state[:, t] = current
    return state


def counter_rate(w: Window, name: str, level: np.ndarray, on: np.ndarray) -> None:
    """Counter rate at level [n, 1] (per second, bursty) where on [n, T] > 0."""
    value = level * on * w.rng.lognormal(0, 0.5, (w.n, STEPS))
    counted = np.rint(value * STEP_SECONDS) / STEP_SECONDS  # whole errors per 5-s period
    w.node[:, :, F[name]] = np.maximum(w.node[:, :, F[name]], counted)


def _link_base(rng, hw, n):
    return healthy_window(rng, hw, n, np.where(rng.random((n, 1)) < 0.75, 1.0, 0.0) * np.ones((n, STEPS)))


def rdma_drop_storm(rng, hw, n):
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 10, n))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.5 + 3 * s), on)
    w.comm_ms = w.comm_ms * (1 + on * (0.3 + 1.5 * s))
    step_slower(w, w.comm_ms - w.comm_ms / (1 + on * (0.3 + 1.5 * s)))
    return w


def ib_symbol_errors(rng, hw, n):
    w = fault_onsets(_link_base(rng, hw, n))
    s, on = severity_of(w), w.after()
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (0.3 + 2.5 * s), on)
    extra = w.comm_ms * on * 0.6 * s
    collectives_slower(w, extra)
    return w


def aer_storm(rng, hw, n):
    w = fault_onsets(_link_base(rng, hw, n))
    s, on = severity_of(w), w.after(rng.integers(1, 20, n))
    counter_rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.7 + 3 * s), on)
    extra = w.comm_ms * on * 0.3 * s
    collectives_slower(w, extra)
    return w


def allreduce_centre(rng, hw, n):
    """The node every ring waits on: its own GPUs, links and disk look normal, only the job's
    collective time (and so its step) grows."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 30, n))
    extra = w.comm_ms * on * (0.6 + 3.0 * s)
    collectives_slower(w, extra)
    return w


def congested_neighbour(rng, hw, n):
    """A node behind the slow centre's switch: its port waits to send, its collectives slow down."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 20, n))
    port_waits_longer(w, 1 + on * (3 + 40 * s))
    extra = w.comm_ms * on * (0.4 + 2.0 * s)
    collectives_slower(w, extra)
    return w


def flapping_link(rng, hw, n):
    """Held out: a link that comes and goes: bursts of symbol errors and drops, collectives spike."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after() * burst_steps(w, on=3, off=10)
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (0.5 + 2 * s), on)
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.3 + 2 * s), on)
    extra = w.comm_ms * on * (0.5 + 2 * s)
    collectives_slower(w, extra)
    return w


def disk_warmer(w: Window, on: np.ndarray, degrees: np.ndarray) -> None:
    disk = w.node[:, :, F["disk_temperature_celsius"]]
    w.node[:, :, F["disk_temperature_celsius"]] = np.rint(disk + on * degrees)


def slow_nvme_clean_smart(rng, hw, n):
    """A drive that answers slowly with nothing in SMART: the job waits for data, GPUs idle a bit,
    the drive runs a little warmer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 15, n))
    extra = w.step_ms * on * (0.1 + 0.9 * s) * rng.lognormal(0, 0.2, (n, STEPS))
    input_slower(w, extra)
    disk_warmer(w, on, rng.uniform(1, 6, (n, 1)))
    return w


def nvme_overheat(rng, hw, n):
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(10, 40, n))
    disk_warmer(w, on, 20 + 25 * s)
    hot = np.clip((w.node[:, :, F["disk_temperature_celsius"]] - 65) / 10, 0, 1)
    extra = w.step_ms * hot * (0.1 + 0.8 * s)
    input_slower(w, extra)
    return w


def nvme_latency_ramp(rng, hw, n):
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 70)
    s, on = severity_of(w), w.after(rng.integers(30, 80, n))
    extra = w.step_ms * on * (0.1 + 1.2 * s)
    input_slower(w, extra)
    disk_warmer(w, on, rng.uniform(0, 3, (n, 1)))
    return w


def data_stall_bursts(rng, hw, n):
    """Held out: input stalls that come and go (a shared file system's hiccups)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after() * burst_steps(w, on=2, off=8)
    extra = w.step_ms * on * (0.3 + 2.5 * s)
    input_slower(w, extra)
    return w


def gpus_slower(w: Window, gpus: np.ndarray, factor: np.ndarray) -> None:
    """Slow the chosen GPUs [n, G] by factor [n, T] (clock and power); the job's step follows the
    slowest, the other ranks wait for it in the collectives."""
    f = np.where(gpus[:, None, :], factor[:, :, None], 1.0)
    w.clock = w.hw.clock_step * np.rint(w.clock * f / w.hw.clock_step)
    w.power = w.hw.idle_power + (w.power - w.hw.idle_power) * f
    slowest = f.min(axis=2)
    extra = w.step_ms * (1 / slowest - 1)
    w.comm_ms = w.comm_ms + 0.6 * extra
    w.step_ms = w.step_ms + extra
    waiting = np.where(gpus[:, None, :], 1.0, 1 - 0.5 * (1 - slowest[:, :, None]))
    w.util = np.rint(w.util * waiting)


def others_wait(w: Window, gpu: np.ndarray, extra: np.ndarray) -> None:
    """Every step takes extra [n, T] ms longer because the GPUs `gpu` [n, 1, G] hold it up, their
    clock and power as before: the other GPUs idle in the collectives meanwhile."""
    waiting = (w.step_ms / (w.step_ms + extra))[:, :, None]
    w.util = np.where(gpu, w.util, np.rint(w.util * waiting))
    w.comm_ms = w.comm_ms + 0.7 * extra
    w.step_ms = w.step_ms + extra


def some_gpus(w: Window, low: int, high: int) -> np.ndarray:
    count = w.rng.integers(low, high + 1, w.n)
    order = np.argsort(w.rng.random((w.n, GPUS)), axis=1)
    return order < count[:, None]


def straggler_gpu(rng, hw, n):
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 10, n))
    gpus_slower(w, some_gpus(w, 1, 1), 1 - on * (0.08 + 0.4 * s))
    return w


def thermal_throttle(rng, hw, n):
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(5, 30, n))
    gpus = some_gpus(w, 1, 3)
    heat = np.where(gpus[:, None, :], on[:, :, None] * (w.hw.load_temp * 0.45 + 12 * s[:, :, None]), 0)
    w.temp = np.rint(w.temp + heat)
    hot = np.clip((w.temp.max(axis=2) - (w.hw.load_temp + 22)) / 8, 0, 1)
    gpus_slower(w, gpus, 1 - hot * (0.1 + 0.4 * s))
    return w


def power_brake(rng, hw, n):
    """The board's power brake (HW slowdown): every GPU drops to a fraction of its power and clock."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    factor = 1 - on * (0.45 + 0.4 * s)
    gpus_slower(w, np.ones((n, GPUS), dtype=bool), factor)
    w.temp = np.rint(w.hw.idle_temp + (w.temp - w.hw.idle_temp) * (0.4 + 0.6 * factor[:, :, None]))
    w.util = np.where(on[:, :, None] > 0, np.clip(w.util + 3, 0, 100), w.util)
    return w


def clock_decay(rng, hw, n):
    """Held out: a slow loss of clock on a few GPUs over minutes (degrading cooling or VRM)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 60)
    s, on = severity_of(w), w.after(rng.integers(40, 90, n))
    gpus_slower(w, some_gpus(w, 2, 4), 1 - on * (0.1 + 0.35 * s))
    return w


Family = Callable[[np.random.Generator, Hardware, int], Window]
# name -> (class, family): the core families; families in HELD_OUT appear only in split "test".
# The generator's whole set (episodes.FAMILIES) adds the earlier hold-outs and the healthy variety.
CORE_FAMILIES: dict[str, tuple[str, Family]] = {
    "healthy.idle": ("healthy", healthy_idle),
    "healthy.training": ("healthy", healthy_training),
    "healthy.power_capped": ("healthy", healthy_power_capped),
    "healthy.job_transition": ("healthy", healthy_transition),
    "communication.rdma_drop_storm": ("communication", rdma_drop_storm),
    "communication.ib_symbol_errors": ("communication", ib_symbol_errors),
    "communication.aer_storm": ("communication", aer_storm),
    "communication.allreduce_centre": ("communication", allreduce_centre),
    "communication.congested_neighbour": ("communication", congested_neighbour),
    "communication.flapping_link": ("communication", flapping_link),
    "storage.slow_nvme_clean_smart": ("storage", slow_nvme_clean_smart),
    "storage.nvme_overheat": ("storage", nvme_overheat),
    "storage.nvme_latency_ramp": ("storage", nvme_latency_ramp),
    "storage.data_stall_bursts": ("storage", data_stall_bursts),
    "compute.straggler_gpu": ("compute", straggler_gpu),
    "compute.thermal_throttle": ("compute", thermal_throttle),
    "compute.power_brake": ("compute", power_brake),
    "compute.clock_decay": ("compute", clock_decay),
}
HELD_OUT = ("communication.flapping_link", "storage.data_stall_bursts", "compute.clock_decay")
# The generator's families that the shipped rules do not catch (docs/design.md "Learned diagnosis"): the
# node's own counters, temperatures and clocks stay normal; the model must find them.
RULES_MISS = ("communication.allreduce_centre", "compute.straggler_gpu", "storage.slow_nvme_clean_smart")
REPLAYED = ("healthy.replay_idle", "healthy.replay_load")  # the test split's, from the capture's later half
# since generator version 10, training replays the capture's earlier half: the model had seen no
# real signal, and version 9 read 2.5 % of the real under-load windows as a communication fault
REPLAYED_TRAINING = ("healthy.replay_idle_early", "healthy.replay_load_early")
# Healthy families that run a workload of their own (their node signals differ from a standard
# training job's): a job's ranks run the same workload, so their stand-in peers in evaluation come
# from the same family (stethoscope_training.evaluate.peer_groups); every other family is "standard".
# None: a pattern of its own in every episode (a swing, a change of pace at its own step), which a
# job's ranks share and no other episode can stand in for; such episodes get no outlier score.
# Names from the core families, fresh sets 1-13 and the current hold-out, set 14.
WORKLOADS: dict[str, str | None] = {
    "healthy.power_capped": "power_capped",
    "healthy.small_batch": "small_batch",
    "healthy.partial_node": "partial_node",
    "healthy.inference_server": "inference_server",
    "healthy.load_wander": None,
    "healthy.periodic_load": None,
    "healthy.phase_change": None,
    "healthy.pipeline_bubbles": None,
    "healthy.eval_phase": None,
    "healthy.checkpoint_saves": None,
    "healthy.job_restart": None,
    "healthy.room_temperature_cycle": None,
    "healthy.two_jobs": "two_jobs",
    "healthy.epoch_boundary": None,
    "healthy.boost_below_cap": "boost_below_cap",
    "healthy.collective_heavy": "collective_heavy",
    "healthy.profiler_stretch": None,
    "healthy.interactive_debug": None,
    "healthy.cpu_offload": "cpu_offload",
    "healthy.gradient_accumulation": None,
    "healthy.inference_ramp": None,
    "healthy.scheduled_trim": None,
    "healthy.composed": None,
    "healthy.checkpoint_upload": None,
    "healthy.power_cap_clock_hunting": "power_cap_clock_hunting",
    "healthy.health_check_bursts": None,
    "healthy.batch_size_raised": None,
    "healthy.periodic_gc_pauses": None,
    "healthy.cpu_bound_input": "cpu_bound_input",
    "healthy.spot_preemption_drain": None,
    "healthy.sequence_length_warmup": None,
    "healthy.shared_node_light_neighbour": "shared_node_light_neighbour",
    "healthy.async_local_checkpoint": None,
    "healthy.shared_leaf_bursts": None,
    "healthy.small_batch_inference_boost": None,
    "healthy.fp8_switch_faster": None,
    "healthy.uneven_pipeline_stages": "uneven_pipeline_stages",
    "healthy.nccl_algorithm_switch": None,
    "healthy.moe_all_to_all_variance": None,
    "healthy.tensor_parallel_over_nvlink": "tensor_parallel_over_nvlink",
    "healthy.liquid_cooled_node": "liquid_cooled_node",
    "healthy.activation_recompute": "activation_recompute",
    "healthy.fully_sharded_gathers": "fully_sharded_gathers",
    "healthy.loss_scale_skipped_steps": None,
}


def workload(family: str) -> str | None:
    return WORKLOADS.get(family, "standard")


def replay(
    rng: np.random.Generator, hw: Hardware, h200: Hardware, capture: Capture, n: int, load: bool, early: bool
):
    """Healthy windows whose GPU signals are the capture's own samples, every tenth (5 s at 2 Hz),
    from a random offset per GPU, cycling through the idle or the at-the-cap samples of the
    capture's earlier half (training) or later half (test); on another class the samples are mapped
    onto its ranges. The node's other signals are healthy synthetic."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load" if load else "idle"))
    samples = capture.load if load else capture.idle
    half = len(samples) // 2
    samples = samples[:half] if early else samples[half:]
    start = rng.integers(0, len(samples), (n, 1, GPUS))
    index = (start + 10 * np.arange(STEPS)[None, :, None]) % len(samples)
    picked = samples[index]  # [n, T, G, 4]
    temp, power, clock, util = (picked[..., c] for c in range(4))
    if hw != h200:
        temp = hw.idle_temp + (temp - h200.idle_temp) * (hw.load_temp - hw.idle_temp) / (
            h200.load_temp - h200.idle_temp
        )
        power = hw.idle_power + (power - h200.idle_power) * (hw.cap_power - hw.idle_power) / (
            h200.cap_power - h200.idle_power
        )
        clock = hw.clock_step * np.rint(
            clock
            * (hw.load_clock if load else hw.idle_clock)
            / (h200.load_clock if load else h200.idle_clock)
            / hw.clock_step
        )
        temp = np.rint(temp)
    w.temp, w.power, w.clock, w.util = temp, power, clock, util
    return w
