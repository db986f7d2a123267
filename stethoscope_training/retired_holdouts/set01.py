"""The first clean hold-out's nine families (fresh set 1). They were written after the model of
generator version 1 had been trained and chosen, and scored it once (macro-F1 0.633: healthy
workloads unlike the training ones read as faults; benchmarks/results/model_fresh_history.json).
Since generator version 2 they are training families (stethoscope_training.episodes), and
stethoscope_training.fresh holds the current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    GPUS,
    Family,
    burst_steps,
    busy_pattern,
    collectives_slower,
    counter_rate,
    disk_warmer,
    fault_onsets,
    gpus_slower,
    healthy_window,
    input_slower,
    port_waits_longer,
    severity_of,
    some_gpus,
    step_slower,
)


def _smooth_walk(rng: np.random.Generator, n: int, scale: float, keep: float = 0.9) -> np.ndarray:
    """[n, T] a slowly wandering signal around 0 (AR(1) with coefficient keep)."""
    steps = rng.normal(0.0, scale, (n, STEPS))
    walk = np.zeros((n, STEPS))
    for t in range(1, STEPS):
        walk[:, t] = keep * walk[:, t - 1] + steps[:, t]
    return walk


# --- healthy -----------------------------------------------------------------------------------


def healthy_small_batch(rng, hw, n):
    """A small-batch job that never reaches the power cap: short, jittery steps (30-120 ms), GPUs
    at 70-90 % utilisation and 55-80 % of the cap's power, so the clock runs near its maximum and
    the GPUs cooler; collectives and input take a larger share of the short step."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    share = rng.uniform(0.55, 0.8, (n, 1, 1))
    w.power = hw.idle_power + (w.power - hw.idle_power) * share
    high = hw.load_clock + (hw.max_clock - hw.load_clock) * rng.uniform(0.5, 1.0, (n, 1, 1))
    clock = high + (w.clock - hw.load_clock)
    w.clock = np.minimum(hw.clock_step * np.rint(clock / hw.clock_step), hw.max_clock)
    w.temp = np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * share**0.8)
    util = rng.uniform(70, 90, (n, 1, 1)) + rng.normal(0, 3.0, (n, STEPS, GPUS)) * w.noise[:, :, None]
    w.util = np.clip(np.rint(util), 0, 100)
    factor = rng.uniform(30, 120, (n, 1)) / w.step_ms.mean(axis=1, keepdims=True)
    jitter = 1 + rng.normal(0, 0.06, (n, STEPS)) * w.noise
    w.step_ms = w.step_ms * factor * jitter
    w.comm_ms = w.comm_ms * factor * rng.uniform(1.0, 1.8, (n, 1))
    w.data_ms = w.data_ms * factor * rng.uniform(1.0, 2.5, (n, 1))
    return w


def healthy_partial_node(rng, hw, n):
    """A job on 2, 4 or 6 of the node's 8 GPUs, the others idle: the node's slowest clock is an
    idle GPU's, its utilisation the busy share, its power a mix of both."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    rest = healthy_window(rng, hw, n, busy_pattern(rng, n, "idle"))
    used = np.argsort(rng.random((n, GPUS)), axis=1) < rng.choice([2, 4, 6], n)[:, None]
    pick = used[:, None, :]
    w.temp = np.where(pick, w.temp, rest.temp)
    w.power = np.where(pick, w.power, rest.power)
    w.clock = np.where(pick, w.clock, rest.clock)
    w.util = np.where(pick, w.util, rest.util)
    return w


def healthy_inference_server(rng, hw, n):
    """An inference server: no training job (no train_ metrics), GPU load following the request
    rate, wandering between a fifth and nearly full; below the cap the clock stays high."""
    load = np.clip(rng.uniform(0.35, 0.75, (n, 1)) + _smooth_walk(rng, n, 0.05), 0.15, 0.95)
    w = healthy_window(rng, hw, n, load)
    w.job = np.zeros((n, STEPS), dtype=bool)
    active = np.clip(load * 4, 0, 1)[:, :, None]
    clock = hw.idle_clock + active * (hw.max_clock - 45 - hw.idle_clock) + rng.normal(0, 15, w.clock.shape)
    w.clock = np.minimum(hw.clock_step * np.rint(clock / hw.clock_step), hw.max_clock)
    return w


# --- communication -----------------------------------------------------------------------------


def rdma_drop_creep(rng, hw, n):
    """RDMA receive drops that rise slowly over minutes (a receive buffer or a NIC firmware leak),
    with now and then a few correctable PCIe errors on the NIC's link; collectives slow with the
    drop rate (retransmissions)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 50)
    s = severity_of(w)
    ramp = w.after(rng.integers(40, 100, n))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (-0.5 + (0.8 + 2.5 * s) * ramp), ramp > 0)
    aer = (ramp > 0) * burst_steps(w, on=1, off=15)
    counter_rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.2 + 1.2 * s), aer)
    factor = 1 + ramp * (0.15 + 1.0 * s)
    extra = w.comm_ms * (factor - 1)
    collectives_slower(w, extra)
    return w


def link_downtrained(rng, hw, n):
    """A link that retrained to a lower width or speed after a short burst of symbol errors: the
    errors stop, but the port now waits to send and every collective stays slower."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    t = np.arange(STEPS)[None, :]
    burst = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(1, 5, (n, 1)))
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (1.0 + 2.0 * s), burst)
    port_waits_longer(w, 1 + on * (2 + 10 * s))
    extra = w.comm_ms * on * (0.4 + 1.5 * s)
    collectives_slower(w, extra)
    return w


# --- storage -----------------------------------------------------------------------------------


def cache_fill_staircase(rng, hw, n):
    """A local cache that fills: each time a tier fills, reads fall through to the slower one and
    the data wait jumps a step higher, then stays; a few steps until the cache is full. The cache's
    drive warms a little with each level."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 40)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    every = rng.integers(8, 20, (n, 1))
    levels = np.clip((t - w.onset[:, None]) // every + 1, 0, rng.integers(3, 7, (n, 1)))
    extra = w.step_ms * levels * (0.05 + 0.25 * s) * rng.lognormal(0, 0.15, (n, STEPS))
    input_slower(w, extra)
    disk_warmer(w, np.ones((n, STEPS)), levels * rng.uniform(0.2, 0.8, (n, 1)))
    return w


def checkpoint_stall_growing(rng, hw, n):
    """Periodic checkpoints that take longer each time (a drive or file system that fills and
    fragments): every 12-24 steps the step stalls for a few steps, each stall longer than the last;
    the input pipeline waits behind the writes, and the drive warms while it writes."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 40)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    period = rng.integers(12, 25, (n, 1))
    since = t - w.onset[:, None]
    index = np.where(since >= 0, since // period, -1)
    length = 1 + np.floor(index * rng.uniform(0.5, 1.5, (n, 1)))
    stalled = (since >= 0) & (since % period < length)
    stall = w.step_ms * stalled * (0.5 + 3.0 * s) * (1 + 0.3 * np.maximum(index, 0))
    w.data_ms = w.data_ms + 0.6 * stall
    step_slower(w, stall)
    disk_warmer(w, stalled.astype(float), rng.uniform(2, 6, (n, 1)))
    return w


# --- compute -----------------------------------------------------------------------------------


def one_gpu_power_sag(rng, hw, n):
    """One GPU whose power drops while its clock holds (its memory or a power rail throttling it):
    it stays busy but gets less done per step, so the job waits for it and the others wait in the
    collectives; it runs cooler."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 6, n))
    gpu = some_gpus(w, 1, 1)[:, None, :]
    sag = (1 - on * (0.25 + 0.45 * s))[:, :, None]
    w.power = np.where(gpu, hw.idle_power + (w.power - hw.idle_power) * sag, w.power)
    w.temp = np.where(gpu, np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.5 + 0.5 * sag)), w.temp)
    extra = w.step_ms * on * (0.05 + 0.4 * s)
    waiting = (w.step_ms / (w.step_ms + extra))[:, :, None]
    w.util = np.where(gpu, w.util, np.rint(w.util * (0.5 + 0.5 * waiting)))
    w.comm_ms = w.comm_ms + 0.6 * extra
    w.step_ms = w.step_ms + extra
    return w


def thermal_creep_pair(rng, hw, n):
    """Two GPUs that warm slowly (a failing fan or clogged filter in their airflow path): their
    temperature creeps up over minutes; at the power cap the leakage of a hotter chip eats into the
    budget, so their clock falls gradually once they are well above normal, and the step follows."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 50)
    s = severity_of(w)
    creep = w.after(rng.integers(50, 100, n))
    pair = some_gpus(w, 2, 2)
    rise = creep[:, :, None] * (8 + 25 * s[:, :, None])
    w.temp = np.where(pair[:, None, :], np.rint(w.temp + rise), w.temp)
    excess = np.clip((w.temp.max(axis=2) - (hw.load_temp + 8)) / 25, 0, 1)
    power = w.power.copy()
    gpus_slower(w, pair, 1 - excess * (0.05 + 0.3 * s))
    w.power = np.where(pair[:, None, :], power, w.power)  # the cap still holds their power
    return w


# name -> (class, family)
SET1: dict[str, tuple[str, Family]] = {
    "healthy.small_batch": ("healthy", healthy_small_batch),
    "healthy.partial_node": ("healthy", healthy_partial_node),
    "healthy.inference_server": ("healthy", healthy_inference_server),
    "communication.rdma_drop_creep": ("communication", rdma_drop_creep),
    "communication.link_downtrained": ("communication", link_downtrained),
    "storage.cache_fill_staircase": ("storage", cache_fill_staircase),
    "storage.checkpoint_stall_growing": ("storage", checkpoint_stall_growing),
    "compute.one_gpu_power_sag": ("compute", one_gpu_power_sag),
    "compute.thermal_creep_pair": ("compute", thermal_creep_pair),
}
