"""The second clean hold-out's nine families (fresh set 2). They were written before the model of
generator version 2 was trained and scored it once (macro-F1 0.756: every fault class found at
0.94-1.0 recall, but healthy jobs whose GPU load swings or whose pace changes read as faults;
benchmarks/results/model_fresh_history.json). Since generator version 3 they are training families
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
    port_waits_longer,
    severity_of,
    some_gpus,
)

# --- healthy -----------------------------------------------------------------------------------


def healthy_pipeline_bubbles(rng, hw, n):
    """A pipeline-parallel job: each stage idles in the pipeline's bubbles, so utilisation and power
    swing with the micro-batch schedule (a period of a few 5-s samples, as the agent's reads alias
    it), the clock rises a little in the troughs; step time and collectives steady."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.uniform(2.2, 6.0, (n, 1))
    depth = rng.uniform(0.15, 0.4, (n, 1))
    trough = (depth * (0.5 + 0.5 * np.sin(2 * np.pi * t / period + rng.uniform(0, 6.3, (n, 1)))))[:, :, None]
    w.util = np.clip(np.rint(w.util * (1 - trough)), 0, 100)
    w.power = w.power - (w.power - hw.idle_power) * trough * 0.8
    w.clock = np.minimum(hw.clock_step * np.rint((w.clock + trough * 200) / hw.clock_step), hw.max_clock)
    w.temp = np.rint(w.temp - trough * 3)
    return w


def healthy_eval_phase(rng, hw, n):
    """A training job that stops for an evaluation pass inside the window: for 10-30 steps the
    steps are forward-only (a third to half as long), collectives small, the input pipeline reads
    the evaluation set (a larger share of the shorter step); then training resumes."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    start = rng.integers(10, STEPS - 35, (n, 1))
    evaluating = (t >= start) & (t < start + rng.integers(10, 31, (n, 1)))
    short = rng.uniform(0.3, 0.5, (n, 1))
    w.step_ms = np.where(evaluating, w.step_ms * short, w.step_ms)
    w.comm_ms = np.where(evaluating, w.comm_ms * short * rng.uniform(0.2, 0.5, (n, 1)), w.comm_ms)
    w.data_ms = np.where(evaluating, w.data_ms * rng.uniform(1.0, 2.0, (n, 1)), w.data_ms)
    util = rng.uniform(0.85, 0.95, (n, 1))
    w.util = np.where(evaluating[:, :, None], np.rint(w.util * util[:, :, None]), w.util)
    return w


def healthy_dataloader_jitter(rng, hw, n):
    """A job reading from a shared file system: the input wait varies from step to step all window
    long (heavy-tailed, a few per cent of the step, now and then a tenth), with nothing changing."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    tail = rng.lognormal(0, rng.uniform(0.6, 1.0, (n, 1)), (n, STEPS))
    wait = w.step_ms * rng.uniform(0.01, 0.04, (n, 1)) * tail
    wait = np.minimum(wait, 0.12 * w.step_ms)
    w.data_ms = wait
    w.step_ms = w.step_ms + 0.5 * wait
    return w


# --- communication -----------------------------------------------------------------------------


def switch_uplink_congestion(rng, hw, n):
    """An oversubscribed uplink on the node's leaf switch as other jobs ramp up: the port waits to
    send more and more over minutes, the collectives slow with it; no errors anywhere."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 60)
    s = severity_of(w)
    ramp = w.after(rng.integers(20, 60, n))
    port_waits_longer(w, 1 + ramp * (2 + 20 * s))
    extra = w.comm_ms * ramp * (0.2 + 1.3 * s) * rng.lognormal(0, 0.15, (n, STEPS))
    collectives_slower(w, extra)
    return w


def nic_pcie_replays(rng, hw, n):
    """The NIC's PCIe link replaying packets (a marginal riser): a steady trickle of correctable AER
    errors, a few per second, and collectives a little slower from the lost link bandwidth."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 8, n))
    counter_rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.2 + 1.5 * s), on)
    extra = w.comm_ms * on * (0.1 + 0.6 * s)
    collectives_slower(w, extra)
    return w


# --- storage -----------------------------------------------------------------------------------


def remote_fs_slowdown(rng, hw, n):
    """The shared file system the job reads from slows down (a busy metadata server): the input
    wait climbs over a few minutes to a plateau; the local drives see nothing, so no disk signal."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 70)
    s = severity_of(w)
    ramp = w.after(rng.integers(6, 30, n))
    extra = w.step_ms * ramp * (0.15 + 1.2 * s) * rng.lognormal(0, 0.3, (n, STEPS))
    input_slower(w, extra)
    return w


def drive_thermal_cycling(rng, hw, n):
    """A local NVMe in a hot spot that throttles in cycles: it heats while the job streams from it,
    throttles (reads slow, the step waits), cools, and again."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 50)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    period = rng.integers(10, 24, (n, 1))
    since = t - w.onset[:, None]
    phase = np.where(since >= 0, (since % period) / period, 0.0)
    heat = np.where(since >= 0, np.sin(np.pi * phase), 0.0)
    disk_warmer(w, heat, 12 + 20 * s)
    hot = np.clip((w.node[:, :, F["disk_temperature_celsius"]] - 62) / 8, 0, 1)
    extra = w.step_ms * hot * (0.2 + 1.0 * s)
    input_slower(w, extra)
    return w


# --- compute -----------------------------------------------------------------------------------


def clocks_locked_low(rng, hw, n):
    """One or two GPUs whose application clocks were locked low (a stray `nvidia-smi -lgc` or a
    leftover profiling setting): at a step their clock drops to 55-80 % and stays, their power
    falls with it; the job waits for them."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    gpus_slower(w, some_gpus(w, 1, 2), 1 - on * (0.2 + 0.25 * s))
    return w


def lost_power_supply(rng, hw, n):
    """One of the node's power supplies fails: the half of the GPUs on its rail are held to a lower
    power limit (clocks fall to what that power allows), the job runs at their pace."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 4, n))
    half = np.zeros((n, GPUS), dtype=bool)
    half[:, : GPUS // 2] = True
    half = np.where(rng.random((n, 1)) < 0.5, half, ~half)
    gpus_slower(w, half, 1 - on * (0.15 + 0.35 * s))
    w.temp = np.where(half[:, None, :], np.rint(w.temp - on[:, :, None] * (3 + 6 * s[:, :, None])), w.temp)
    return w


# name -> (class, family)
SET2: dict[str, tuple[str, Family]] = {
    "healthy.pipeline_bubbles": ("healthy", healthy_pipeline_bubbles),
    "healthy.eval_phase": ("healthy", healthy_eval_phase),
    "healthy.dataloader_jitter": ("healthy", healthy_dataloader_jitter),
    "communication.switch_uplink_congestion": ("communication", switch_uplink_congestion),
    "communication.nic_pcie_replays": ("communication", nic_pcie_replays),
    "storage.remote_fs_slowdown": ("storage", remote_fs_slowdown),
    "storage.drive_thermal_cycling": ("storage", drive_thermal_cycling),
    "compute.clocks_locked_low": ("compute", clocks_locked_low),
    "compute.lost_power_supply": ("compute", lost_power_supply),
}
