"""The sixth clean hold-out's nine families (fresh set 6). They were written before the model of
generator version 6 was trained and scored it once (macro-F1 0.800, 22.8 % of healthy episodes with
a finding: a profiler's stretch of slower steps read as a communication fault, a rank that came back
on the far NIC after a restart read as storage or healthy;
benchmarks/results/model_fresh_history.json). Since generator version 7 they are training families
(stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    GPUS,
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
from stethoscope_training.families_healthy_variety import load_following

# --- healthy -----------------------------------------------------------------------------------


def healthy_profiler_stretch(rng, hw, n):
    """Someone profiles the job for a stretch of 30 s to two minutes (nsys, the torch profiler):
    while it records, each step takes 10-40 % longer and the GPUs are a little less busy; before
    and after, the job runs as ever."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    start = rng.integers(5, STEPS - 25, (n, 1))
    recording = (t >= start) & (t < start + rng.integers(6, 25, (n, 1)))
    step_slower(w, w.step_ms * recording * rng.uniform(0.1, 0.4, (n, 1)))
    return w


def healthy_interactive_debug(rng, hw, n):
    """An interactive session on the node (a notebook, a debugger): the GPUs are busy in short
    bursts and idle in between, each step takes its own time of one to ten seconds, and a good
    share of it is spent waiting for input read by hand-written loaders."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    level = np.clip(rng.lognormal(np.log(0.3), 0.6, (n, STEPS)), 0.03, 0.9)
    load_following(w, level)
    w.step_ms = 10 ** rng.uniform(3, 4, (n, 1)) * rng.lognormal(0, 0.5, (n, STEPS))
    w.data_ms = w.step_ms * rng.uniform(0.1, 0.4, (n, 1)) * rng.lognormal(0, 0.3, (n, STEPS))
    w.comm_ms = w.step_ms * rng.uniform(0.0, 0.05, (n, 1))
    return w


def healthy_cpu_offload(rng, hw, n):
    """A job that keeps its optimizer state in host memory (ZeRO offload): every step copies over
    PCIe, so the GPUs are busy only 55-80 % of the time and draw less, the step is longer than the
    GPUs alone would need. Steady over the window."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    level = rng.uniform(0.55, 0.8, (n, 1))
    load_following(w, np.broadcast_to(level, (n, STEPS)))
    w.step_ms = w.step_ms / level
    return w


# --- communication -----------------------------------------------------------------------------


def pfc_pause_storm(rng, hw, n):
    """A RoCE switch port pauses its senders in storms (PFC pause frames from a congested
    receiver): from the onset, in bursts, the node's ports wait 50-500 times as long to send and the
    collectives stretch with them; lossless, so no drop or error is counted."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    storm = w.after() * burst_steps(w, on=4, off=8)
    port_waits_longer(w, 1 + storm * 10 ** (1.7 + 1.0 * s))
    collectives_slower(w, w.comm_ms * storm * (0.5 + 2.5 * s))
    return w


def nic_affinity_after_restart(rng, hw, n):
    """A rank restarts at the onset (its process died and the launcher respawned it) and lands on
    the NIC of the other socket: a gap of 15-40 s while it rejoins, then every collective crosses
    the socket interconnect, 20-80 % slower, and the port sends less (it waits less to send)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    gap = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(3, 9, (n, 1)))
    after = t >= w.onset[:, None] + gap.sum(axis=1, keepdims=True)
    w.util = np.where(gap[:, :, None], 0.0, w.util)
    w.power = np.where(gap[:, :, None], hw.idle_power * rng.uniform(1.0, 1.2, (n, 1, 1)), w.power)
    w.job = w.job & ~gap
    port_waits_longer(w, np.where(after, rng.uniform(0.3, 0.8, (n, 1)), 1.0))
    collectives_slower(w, w.comm_ms * after * (0.2 + 0.6 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def noisy_neighbour_io(rng, hw, n):
    """Another tenant's job on the node hammers the shared local NVMe from the onset, in spells of
    half a minute to a minute and a half: the drive warms by 5-10 C and this job's reads queue
    behind the other's, a long-tailed wait for input."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    spell = w.after() * burst_steps(w, on=12, off=10)
    disk_warmer(w, spell, 5 + 5 * s)
    extra = w.step_ms * spell * (0.2 + 1.5 * s) * rng.lognormal(0, 0.6, (n, STEPS))
    input_slower(w, extra)
    return w


def degraded_raid_reads(rng, hw, n):
    """A RAID member drops out at the onset: every read of its stripes is rebuilt from the others,
    so the input wait doubles to quintuples at once and varies more; the surviving drives work
    harder, 2-4 C warmer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    factor = 1 + on * (1 + 3 * s) * rng.lognormal(0, 0.35, (n, STEPS))
    input_slower(w, w.data_ms * (factor - 1) + w.step_ms * on * (0.05 + 0.3 * s))
    disk_warmer(w, on, rng.uniform(2, 4, (n, 1)))
    return w


# --- compute -----------------------------------------------------------------------------------


def hw_slowdown_flapping(rng, hw, n):
    """The board's hardware slowdown asserts and clears again and again from the onset (a power
    supply near its limit): every GPU drops to 30-60 % of its clock and power for a sample or a few,
    about every minute, and the steps in those samples are slow."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    brake = w.after() * burst_steps(w, on=2, off=12)
    gpus_slower(w, np.ones((n, GPUS), dtype=bool), 1 - brake * (0.4 + 0.3 * s))
    return w


def gpu_reset_mid_job(rng, hw, n):
    """One GPU hits an Xid and is reset at the onset: for 15-50 s it idles at its lowest clock and
    the job stalls (no step is reported); then the job resumes, the reset GPU a little slower than
    before (5-20 %, a lower clock after the reset) and every step waits for it."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    reset = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(3, 11, (n, 1)))
    after = (t >= w.onset[:, None]) & ~reset
    gpu = some_gpus(w, 1, 1)
    gpus_slower(w, gpu, 1 - after * (0.05 + 0.15 * s))
    g = gpu[:, None, :] & reset[:, :, None]
    w.util = np.where(reset[:, :, None], np.where(g, 0.0, np.rint(w.util * 0.1)), w.util)
    w.power = np.where(g, hw.idle_power, np.where(reset[:, :, None], w.power * 0.6, w.power))
    w.clock = np.where(g, hw.idle_clock, w.clock)
    w.job = w.job & ~reset
    return w


# name -> (class, family)
SET6: dict[str, tuple[str, Family]] = {
    "healthy.profiler_stretch": ("healthy", healthy_profiler_stretch),
    "healthy.interactive_debug": ("healthy", healthy_interactive_debug),
    "healthy.cpu_offload": ("healthy", healthy_cpu_offload),
    "communication.pfc_pause_storm": ("communication", pfc_pause_storm),
    "communication.nic_affinity_after_restart": ("communication", nic_affinity_after_restart),
    "storage.noisy_neighbour_io": ("storage", noisy_neighbour_io),
    "storage.degraded_raid_reads": ("storage", degraded_raid_reads),
    "compute.hw_slowdown_flapping": ("compute", hw_slowdown_flapping),
    "compute.gpu_reset_mid_job": ("compute", gpu_reset_mid_job),
}
