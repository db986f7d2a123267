"""The ninth clean hold-out's nine families (fresh set 9). They were written before the model of
generator version 9 was trained and scored it once (macro-F1 0.830, 15.5 % of healthy episodes with
a finding: periodic host pauses read as a storage fault, a GPU off the bus whose job hangs read as
healthy; benchmarks/results/model_fresh_history.json). Since generator version 10 they are training
families (stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the current
hold-out."""

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


def healthy_batch_size_raised(rng, hw, n):
    """An engineer raises the batch size at a restart-free checkpoint: from that step on each step
    does more work, takes one and a half to three times as long, the GPUs are busier and at their
    power cap; the collectives (the same gradients) take as long as before."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    later = t >= rng.integers(10, STEPS - 10, (n, 1))
    compute = w.step_ms - w.comm_ms
    w.step_ms = np.where(later, compute * rng.uniform(1.5, 3, (n, 1)) + w.comm_ms, w.step_ms)
    w.util = np.where(later[:, :, None], np.clip(w.util + 2, 0, 100), w.util)
    return w


def healthy_periodic_gc_pauses(rng, hw, n):
    """The training script's host side pauses now and then (Python's garbage collector, the
    allocator defragmenting): in one sample in 4-12, at random, the step takes two to five times
    as long with the GPUs idle; nothing on the node's parts moves."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    pause = rng.random((n, STEPS)) < 1 / rng.uniform(4, 12, (n, 1))  # one sample in 4-12
    step_slower(w, w.step_ms * pause * rng.uniform(1, 4, (n, STEPS)))
    return w


def healthy_cpu_bound_input(rng, hw, n):
    """A job whose data loader is CPU-bound from the start (heavy augmentation, too few workers):
    each step waits 20-40 % of its time for input, more or less from step to step, the GPUs idle
    meanwhile; steady over the window, nothing wrong with the drive."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    share = rng.uniform(0.2, 0.4, (n, 1)) * rng.lognormal(0, 0.2, (n, STEPS))
    input_slower(w, w.step_ms * share / (1 - np.minimum(share, 0.8)))
    return w


# --- communication -----------------------------------------------------------------------------


def lossy_roce_retransmits(rng, hw, n):
    """A path without flow control after a switch change at the onset (lossy RoCE): a few packets
    are lost, the queue pairs count out-of-sequence drops at a low rate and go back N, so the
    collectives get a long-tailed extra time; the links themselves count no errors."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 10, n))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (-0.3 + 1.3 * s), on)
    tail = rng.lognormal(0, 0.7, (n, STEPS))
    collectives_slower(w, w.comm_ms * on * (0.1 + 1.0 * s) * tail)
    return w


def leaf_switch_reboot(rng, hw, n):
    """The node's leaf switch reboots at the onset: for 30-90 s the link is down, the job makes no
    progress and reports no step; when the link comes back a burst of symbol errors and drops is
    counted and the collectives are slow for a minute while the job catches up."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    down_len = rng.integers(6, 19, (n, 1))
    down = (t >= w.onset[:, None]) & (t < w.onset[:, None] + down_len)
    back = (t >= w.onset[:, None] + down_len) & (t < w.onset[:, None] + down_len + 12)
    first = (t >= w.onset[:, None] + down_len) & (t < w.onset[:, None] + down_len + 2)
    w.util = np.where(down[:, :, None], 0.0, w.util)
    w.power = np.where(down[:, :, None], hw.idle_power * rng.uniform(1.0, 1.3, (n, 1, 1)), w.power)
    w.job = w.job & ~down
    port_waits_longer(w, np.where(down, 0.0, 1.0))
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (0.5 + 1.5 * s), first.astype(float))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.5 + 1.5 * s), first.astype(float))
    collectives_slower(w, w.comm_ms * back * (1 + 3 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def parallel_fs_slow_target(rng, hw, n):
    """One storage target of the parallel file system slows down at the onset (a degraded disk
    pool behind it): the reads striped onto it take five to twenty times as long, so a fifth to
    two fifths of the samples show a long input wait; the others are as before."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    hit = w.after() * (rng.random((n, STEPS)) < rng.uniform(0.2, 0.4, (n, 1)))
    input_slower(w, hit * (w.data_ms * rng.uniform(4, 19, (n, STEPS)) + w.step_ms * (0.1 + 0.6 * s)))
    return w


def nvme_throttle_cycles(rng, hw, n):
    """A drive in a badly cooled bay reaches its thermal limit after the onset and throttles in
    cycles: its temperature climbs to 70-75 C, it slows and cools a few degrees, then climbs again;
    in the throttled part of each cycle the job's reads wait two to five times as long."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 60)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    disk = w.node[:, :, F["disk_temperature_celsius"]]
    ramp = w.after(rng.integers(10, 30, n))
    cycle = 0.5 + 0.5 * np.sin(2 * np.pi * t / rng.uniform(10, 30, (n, 1)))
    target = 70 + 5 * cycle
    w.node[:, :, F["disk_temperature_celsius"]] = np.rint(disk + ramp * (target - disk))
    throttled = (ramp >= 1) & (cycle > 0.5)
    input_slower(w, throttled * (w.data_ms * (1 + 3 * s) + w.step_ms * (0.05 + 0.3 * s)))
    return w


# --- compute -----------------------------------------------------------------------------------


def gpu_fell_off_bus(rng, hw, n):
    """One GPU falls off the bus at the onset (Xid 79): it reports nothing from then on, so the
    node's sums and extremes cover seven GPUs, and the job hangs: no step is reported after it,
    and the other GPUs spin in the collective that never completes (busy, at low power, cooling)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 100)
    on = (w.after() > 0)[:, :, None]
    gone = some_gpus(w, 1, 1)[:, None, :] & on
    w.util = np.where(on, 100.0, w.util)  # the gone GPU's too, so the mean is the others'
    w.power = np.where(on, hw.idle_power + 0.2 * (w.power - hw.idle_power), w.power)
    w.temp = np.where(on, np.rint(hw.idle_temp + 0.6 * (w.temp - hw.idle_temp)), w.temp)
    w.power = np.where(gone, 0.0, w.power)  # left out of the sum
    w.temp = np.where(gone, -np.inf, w.temp)  # and of the extremes
    w.clock = np.where(gone, np.inf, w.clock)
    w.job = w.job & ~on[:, :, 0]
    return w


def power_limit_misapplied(rng, hw, n):
    """A power policy is pushed at the onset with the wrong limit: from then on every GPU is held at
    some 60-80 % of its usual power above idle, its clock falls with it, and every step takes
    longer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    on = w.after(rng.integers(1, 4, n))
    limit = 1 - on * rng.uniform(0.25, 0.5, (n, 1))
    gpus_slower(w, np.ones((n, GPUS), dtype=bool), limit**0.7)
    w.temp = np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.5 + 0.5 * limit[:, :, None]))
    return w


# name -> (class, family)
SET9: dict[str, tuple[str, Family]] = {
    "healthy.batch_size_raised": ("healthy", healthy_batch_size_raised),
    "healthy.periodic_gc_pauses": ("healthy", healthy_periodic_gc_pauses),
    "healthy.cpu_bound_input": ("healthy", healthy_cpu_bound_input),
    "communication.lossy_roce_retransmits": ("communication", lossy_roce_retransmits),
    "communication.leaf_switch_reboot": ("communication", leaf_switch_reboot),
    "storage.parallel_fs_slow_target": ("storage", parallel_fs_slow_target),
    "storage.nvme_throttle_cycles": ("storage", nvme_throttle_cycles),
    "compute.gpu_fell_off_bus": ("compute", gpu_fell_off_bus),
    "compute.power_limit_misapplied": ("compute", power_limit_misapplied),
}
