"""The fourth clean hold-out's nine families (fresh set 4). They were written before the model of
generator version 4 was trained and scored it once (macro-F1 0.881, 3.3 % of healthy episodes with a
finding: a GPU that gets less done at the same clock and power read as a communication fault;
benchmarks/results/model_fresh_history.json). Since generator version 5 they are training families
(stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    GPUS,
    F,
    Family,
    busy_pattern,
    collectives_slower,
    counter_rate,
    disk_warmer,
    fault_onsets,
    gpus_slower,
    healthy_window,
    input_slower,
    others_wait,
    port_waits_longer,
    severity_of,
    some_gpus,
)

# --- healthy -----------------------------------------------------------------------------------


def healthy_job_restart(rng, hw, n):
    """One job ends and the next starts inside the window: the GPUs idle for 15 s to a minute and a
    quarter between them, the new job has a pace of its own and slow first steps (warm-up)."""
    t = np.arange(STEPS)[None, :]
    end = rng.integers(20, STEPS - 40, (n, 1))
    start = end + rng.integers(3, 16, (n, 1))
    busy = ((t < end) | (t >= start)).astype(float)
    w = healthy_window(rng, hw, n, busy)
    second = t >= start
    pace = rng.uniform(0.4, 2.5, (n, 1))
    w.step_ms = np.where(second, w.step_ms * pace, w.step_ms)
    w.comm_ms = np.where(second, w.comm_ms * pace * rng.uniform(0.5, 2.0, (n, 1)), w.comm_ms)
    w.data_ms = np.where(second, w.data_ms * pace * rng.uniform(0.5, 2.0, (n, 1)), w.data_ms)
    warm = second & (t < start + rng.integers(2, 7, (n, 1)))
    w.step_ms = np.where(warm, w.step_ms * rng.uniform(1.5, 3.0, (n, 1)), w.step_ms)
    return w


def healthy_two_jobs(rng, hw, n):
    """Two jobs share the node, four GPUs each: one at full load, the other lighter (40-80 % busy),
    its GPUs at lower power and higher clocks; the step time reported is the slower job's."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    light = np.zeros((n, GPUS), dtype=bool)
    light[:, GPUS // 2 :] = True
    light = np.where(rng.random((n, 1)) < 0.5, light, ~light)[:, None, :]
    level = rng.uniform(0.4, 0.8, (n, 1, 1))
    w.util = np.where(light, np.clip(np.rint(w.util * level), 0, 100), w.util)
    w.power = np.where(light, hw.idle_power + (w.power - hw.idle_power) * level, w.power)
    up = hw.clock_step * np.rint((w.clock + (1 - level) * (hw.max_clock - hw.load_clock)) / hw.clock_step)
    w.clock = np.where(light, np.minimum(up, hw.max_clock), w.clock)
    w.temp = np.where(light, np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.5 + 0.5 * level)), w.temp)
    return w


def healthy_room_temperature_cycle(rng, hw, n):
    """The room's cooling cycles: the inlet air, and with it every GPU and drive, warms and cools by
    2-5 C over 8-30 minutes; clocks, power and pace unchanged (well below any slowdown)."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.uniform(96, 360, (n, 1))
    swing = rng.uniform(2, 5, (n, 1)) * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi, (n, 1)))
    w.temp = np.rint(w.temp + swing[:, :, None])
    w.node[:, :, F["disk_temperature_celsius"]] = np.rint(w.node[:, :, F["disk_temperature_celsius"]] + swing)
    return w


# --- communication -----------------------------------------------------------------------------


def link_flap_once(rng, hw, n):
    """The node's IB link goes down once for 5-15 s and comes back: the collectives in flight stall
    (a step many times as long), the port waits; afterwards a trickle of symbol errors remains and
    collectives stay a little slower (retransmissions)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 20, 100)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    down = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(1, 4, (n, 1)))
    after = w.after()
    port_waits_longer(w, 1 + down * (10 + 40 * s))
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (-0.7 + 1.2 * s), after)
    extra = w.comm_ms * (down * (5 + 15 * s) + after * (0.05 + 0.25 * s))
    collectives_slower(w, extra)
    return w


def rdma_retry_steady(rng, hw, n):
    """RDMA receive drops at a steady moderate rate from the onset (a mis-set buffer after a driver
    update): the collectives retransmit and take longer, with no link errors."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 5, n))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.3 + 1.4 * s), on)
    collectives_slower(w, w.comm_ms * on * (0.15 + 0.65 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def raid_rebuild(rng, hw, n):
    """The local RAID starts rebuilding a member: the drives work harder and warm by 4-10 C over a
    minute or two, and the job's reads wait behind the rebuild's."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    ramp = w.after(rng.integers(10, 25, n))
    disk_warmer(w, ramp, 4 + 6 * s)
    extra = w.data_ms * ramp * (0.5 + 3 * s) + w.step_ms * ramp * (0.05 + 0.35 * s)
    input_slower(w, extra * rng.lognormal(0, 0.2, (n, STEPS)))
    return w


def nvme_gc_stalls(rng, hw, n):
    """A drive whose garbage collection stalls reads once it is nearly full: from the onset, every
    6-20 samples one sample's input wait is half a step to three steps long; the drive a little warmer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 70)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = t - w.onset[:, None]
    stall = (since >= 0) & (since % rng.integers(6, 21, (n, 1)) == 0)
    input_slower(w, w.step_ms * stall * (0.5 + 2.5 * s))
    disk_warmer(w, (since >= 0).astype(float), rng.uniform(1, 3, (n, 1)))
    return w


# --- compute -----------------------------------------------------------------------------------


def fans_failing(rng, hw, n):
    """The node's fans fail one after another: every GPU warms slowly by 10-25 C over several
    minutes, and once the hottest runs well above normal all clocks come down and the step with them."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 40)
    s = severity_of(w)
    ramp = w.after(rng.integers(40, 100, n))
    w.temp = np.rint(w.temp + ramp[:, :, None] * (10 + 15 * s[:, :, None]))
    hot = np.clip((w.temp.max(axis=2) - (hw.load_temp + 12)) / 10, 0, 1)
    gpus_slower(w, np.ones((n, GPUS), dtype=bool), 1 - hot * (0.1 + 0.2 * s))
    return w


def memory_bound_straggler(rng, hw, n):
    """One GPU gets less done per step at the same clock and power (retired memory rows, a degraded
    HBM stack): a little warmer, every step waits for it, the other GPUs idle in the collectives."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 6, n))
    gpu = some_gpus(w, 1, 1)[:, None, :]
    w.temp = np.where(gpu, np.rint(w.temp + on[:, :, None] * (2 + 3 * s[:, :, None])), w.temp)
    extra = w.step_ms * on * (0.05 + 0.3 * s)
    others_wait(w, gpu, extra)
    return w


# name -> (class, family)
SET4: dict[str, tuple[str, Family]] = {
    "healthy.job_restart": ("healthy", healthy_job_restart),
    "healthy.two_jobs": ("healthy", healthy_two_jobs),
    "healthy.room_temperature_cycle": ("healthy", healthy_room_temperature_cycle),
    "communication.link_flap_once": ("communication", link_flap_once),
    "communication.rdma_retry_steady": ("communication", rdma_retry_steady),
    "storage.raid_rebuild": ("storage", raid_rebuild),
    "storage.nvme_gc_stalls": ("storage", nvme_gc_stalls),
    "compute.fans_failing": ("compute", fans_failing),
    "compute.memory_bound_straggler": ("compute", memory_bound_straggler),
}
