"""The third clean hold-out's nine families (fresh set 3). They were written before the model of
generator version 3 was trained and scored it once (macro-F1 0.730, 32 % of healthy episodes with a
finding: routine checkpoint saves read as a storage fault, a hung GPU read as healthy;
benchmarks/results/model_fresh_history.json). Since generator version 4 they are training families
(stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    F,
    Family,
    burst_steps,
    busy_pattern,
    collectives_slower,
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

# --- healthy -----------------------------------------------------------------------------------


def healthy_checkpoint_saves(rng, hw, n):
    """A job that saves a checkpoint every 15-40 steps, as it has all along: each save stalls the
    steps for 1-3 samples by the same amount, the input waits behind the writes and the local
    drive warms while it writes, then cools."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.integers(15, 41, (n, 1))
    length = rng.integers(1, 4, (n, 1))
    saving = (t + rng.integers(0, 40, (n, 1))) % period < length
    stall = w.step_ms * saving * rng.uniform(0.3, 1.5, (n, 1))
    w.data_ms = w.data_ms + 0.5 * stall
    step_slower(w, stall)
    disk_warmer(w, saving.astype(float), rng.uniform(1, 4, (n, 1)))
    return w


def healthy_hot_aisle(rng, hw, n):
    """A node in a warm spot of the room: its GPUs run 5-10 C warmer than most from the start of the
    window and stay there, well below any slowdown; clocks, power and pace as any other node."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    w.temp = w.temp + np.rint(rng.uniform(5, 10, (n, 1, 1)))
    w.node[:, :, F["disk_temperature_celsius"]] += np.rint(rng.uniform(2, 6, (n, 1)))
    return w


def healthy_variable_sequences(rng, hw, n):
    """A job with variable-length sequences (packing off): every step takes its own time, a fifth
    to two fifths spread around its mean, the collectives with it; the GPUs stay busy."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    spread = rng.lognormal(0, rng.uniform(0.2, 0.4, (n, 1)), (n, STEPS))
    spread = spread / np.median(spread, axis=1, keepdims=True)
    w.step_ms = w.step_ms * spread
    w.comm_ms = w.comm_ms * (0.5 + 0.5 * spread)
    return w


# --- communication -----------------------------------------------------------------------------


def nic_rail_down(rng, hw, n):
    """One of the node's NICs (a rail) goes down cleanly: no errors on the others, but their ports
    now carry its share, so they wait to send more and every collective takes longer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    port_waits_longer(w, 1 + on * (0.5 + 3 * s))
    extra = w.comm_ms * on * (0.25 + 1.0 * s)
    collectives_slower(w, extra)
    return w


def remote_collective_hiccups(rng, hw, n):
    """Another node of the job hiccups (its own fault, not this node's): this node's collectives
    spike now and then for a sample or two, longer as it gets worse; nothing on this node itself."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    on = w.after() * burst_steps(w, on=1.5, off=6)
    grows = w.after(rng.integers(20, 60, w.n))
    extra = w.comm_ms * on * (0.5 + 3.0 * s) * (0.5 + 0.5 * grows)
    collectives_slower(w, extra)
    return w


# --- storage -----------------------------------------------------------------------------------


def drive_wearing_out(rng, hw, n):
    """A local drive near the end of its life: reads retry, so the input wait rises slowly over the
    window with spikes now and then, and the drive runs a few degrees warmer as it works harder."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 50)
    s = severity_of(w)
    ramp = w.after(rng.integers(40, 90, w.n))
    spikes = burst_steps(w, on=1, off=10) * rng.uniform(1, 4, (n, STEPS))
    extra = w.step_ms * ramp * (0.1 + 0.8 * s) * (1 + spikes)
    input_slower(w, extra)
    disk_warmer(w, ramp, 2 + 6 * s)
    return w


def page_cache_thrash(rng, hw, n):
    """The data set outgrows the page cache (another job took the memory): input waits come in
    spikes, more often as the window goes on; the drive warms a little with the extra reads."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 60)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = np.clip(t - w.onset[:, None], 0, None)
    chance = np.where(t >= w.onset[:, None], 0.1 + 0.5 * since / STEPS, 0.0)
    miss = rng.random((n, STEPS)) < chance
    extra = w.step_ms * miss * (0.4 + 2.0 * s) * rng.lognormal(0, 0.3, (n, STEPS))
    input_slower(w, extra)
    disk_warmer(w, (since > 0).astype(float), rng.uniform(0.5, 2.5, (n, 1)))
    return w


# --- compute -----------------------------------------------------------------------------------


def hbm_temperature_throttle(rng, hw, n):
    """One or two GPUs whose memory runs hot (a poorly seated heat sink): their die temperature is
    only a few degrees up, but the memory throttles in bouts, the clock dips during each, the job
    waits for them."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    gpus = some_gpus(w, 1, 2)
    bouts = w.after() * np.maximum(burst_steps(w, on=3, off=5), 0.3)
    w.temp = np.where(gpus[:, None, :], np.rint(w.temp + bouts[:, :, None] * (2 + 5 * s[:, :, None])), w.temp)
    gpus_slower(w, gpus, 1 - bouts * (0.1 + 0.35 * s))
    return w


def gpu_hung(rng, hw, n):
    """A GPU hangs (the kernel never returns, XID 79 before it falls off the bus): from the onset it
    shows full utilisation at a low power, the other GPUs fall idle waiting in a collective, and
    the job stops reporting steps (training stuck)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 20, 110)
    on = w.after()[:, :, None] > 0
    hung = some_gpus(w, 1, 1)[:, None, :]
    rest = healthy_window(rng, hw, n, busy_pattern(rng, n, "idle"))
    stuck_power = hw.idle_power * rng.uniform(1.3, 2.0, (n, 1, 1))
    w.util = np.where(on, np.where(hung, 100.0, rest.util), w.util)
    w.power = np.where(on, np.where(hung, stuck_power, rest.power * 1.1), w.power)
    w.clock = np.where(on, np.where(hung, w.clock, rest.clock), w.clock)
    w.temp = np.where(on, np.rint(np.maximum(rest.temp, w.temp - (w.temp - rest.temp) * 0.5)), w.temp)
    w.job = w.job & ~on[:, :, 0]
    return w


# name -> (class, family)
SET3: dict[str, tuple[str, Family]] = {
    "healthy.checkpoint_saves": ("healthy", healthy_checkpoint_saves),
    "healthy.hot_aisle": ("healthy", healthy_hot_aisle),
    "healthy.variable_sequences": ("healthy", healthy_variable_sequences),
    "communication.nic_rail_down": ("communication", nic_rail_down),
    "communication.remote_collective_hiccups": ("communication", remote_collective_hiccups),
    "storage.drive_wearing_out": ("storage", drive_wearing_out),
    "storage.page_cache_thrash": ("storage", page_cache_thrash),
    "compute.hbm_temperature_throttle": ("compute", hbm_temperature_throttle),
    "compute.gpu_hung": ("compute", gpu_hung),
}
