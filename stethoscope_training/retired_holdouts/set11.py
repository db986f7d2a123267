"""The eleventh clean hold-out's nine families (fresh set 11). They were written after set 10 scored
the model of generator version 10 (the one shipped until version 11), as a second hold-out for the
same model, and scored it (macro-F1 0.881, 7.67 % of healthy episodes with a finding: an HCA
firmware hang read as healthy half the time, a shared leaf's traffic spells and an async local
checkpoint read as faults; benchmarks/results/model_fresh_history.json). Since generator version 11
they are training families (stethoscope_training.episodes.FAMILIES), with set 10's;
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
from stethoscope_training.families_healthy_variety import load_following

# --- healthy -----------------------------------------------------------------------------------


def healthy_async_local_checkpoint(rng, hw, n):
    """Every three to five minutes the job writes an asynchronous checkpoint to the local NVMe: for
    a minute or two the drive warms by 2-5 C, the reads from the same drive wait 20-60 % longer and
    each step takes 5-10 % longer; the job has done this all along."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.integers(36, 61, (n, 1))
    writing = (t + rng.integers(0, 60, (n, 1))) % period < rng.integers(12, 25, (n, 1))
    disk_warmer(w, writing.astype(float), rng.uniform(2, 5, (n, 1)))
    w.data_ms = np.where(writing, w.data_ms * rng.uniform(1.2, 1.6, (n, 1)), w.data_ms)
    step_slower(w, w.step_ms * writing * rng.uniform(0.05, 0.1, (n, 1)))
    return w


def healthy_shared_leaf_bursts(rng, hw, n):
    """Other jobs' traffic crosses the same leaf switch in spells: now and then the node's ports
    wait two to six times as long to send and this job's collectives take 5-25 % longer, for half a
    minute to two minutes; the job has seen this all along."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    spell = burst_steps(w, on=12, off=20)
    port_waits_longer(w, 1 + spell * rng.uniform(1, 5, (n, 1)))
    collectives_slower(w, w.comm_ms * spell * rng.uniform(0.05, 0.25, (n, 1)))
    return w


def healthy_small_batch_inference_boost(rng, hw, n):
    """Small-batch inference with gaps between requests: the GPUs are 40-70 % busy from sample to
    sample, boost their clocks in the gaps and draw 40-80 % of the way to the cap."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    level = np.clip(rng.uniform(0.4, 0.7, (n, 1)) + rng.normal(0, 0.08, (n, STEPS)), 0.2, 1.0)
    load_following(w, level)
    w.comm_ms = w.step_ms * rng.uniform(0.0, 0.02, (n, 1))
    return w


# --- communication -----------------------------------------------------------------------------


def hca_firmware_hang(rng, hw, n):
    """The HCA's firmware hangs at the onset for 10-25 s and recovers by itself: no traffic moves
    (the port sends nothing), the collectives in flight time out and retry, a step takes many
    times as long; after it a few drops are counted and the job goes on as before."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 100)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    hang_len = rng.integers(2, 6, (n, 1))
    hang = (t >= w.onset[:, None]) & (t < w.onset[:, None] + hang_len)
    after = (t >= w.onset[:, None] + hang_len) & (t < w.onset[:, None] + hang_len + 3)
    port_waits_longer(w, np.where(hang, 0.0, 1.0))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.3 + 1.0 * s), after.astype(float))
    collectives_slower(w, w.comm_ms * hang * (5 + 20 * s))
    return w


def in_network_reduction_off(rng, hw, n):
    """The switches' in-network reduction (SHARP) is turned off at the onset by a fabric update:
    every all-reduce now goes the long way round, 30-100 % slower, and the ports wait one and a half
    to three times as long to send; nothing is dropped or counted."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 4, n))
    port_waits_longer(w, 1 + on * rng.uniform(0.5, 2, (n, 1)))
    collectives_slower(w, w.comm_ms * on * (0.3 + 0.7 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def fuse_mount_stalls(rng, hw, n):
    """The job reads through a FUSE mount of an object store whose daemon stalls from the onset,
    every one to three minutes, for 5-20 s: the steps in those samples wait for their input, the
    GPUs idle; the local drive is not involved."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = t - w.onset[:, None]
    stall = (since >= 0) & (since % rng.integers(12, 37, (n, 1)) < rng.integers(1, 5, (n, 1)))
    input_slower(w, stall * w.step_ms * (1 + 5 * s))
    return w


def drive_latency_spikes(rng, hw, n):
    """A drive whose firmware pauses for internal housekeeping from the onset: a tenth to a quarter
    of the samples wait some 65-750 ms more for their input (and twice their usual wait), a
    long-tailed input wait; the drive's temperature does not move."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    spike = w.after() * (rng.random((n, STEPS)) < rng.uniform(0.1, 0.25, (n, 1)))
    input_slower(w, spike * (rng.uniform(100, 500, (n, STEPS)) * (0.5 + s) + w.data_ms * 2))
    return w


# --- compute -----------------------------------------------------------------------------------


def bmc_power_budget_steps(rng, hw, n):
    """The node's BMC lowers its power budget in steps from the onset (a rack-level cap after a
    feed failed): every GPU's power and clock come down by a tenth at each of two or three steps a
    minute or two apart, and the job's steps get longer with them."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 60)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    gap = rng.integers(12, 25, (n, 1))
    steps = np.clip((t - w.onset[:, None]) // gap + 1, 0, rng.integers(2, 4, (n, 1)))
    gpus_slower(w, np.ones((n, GPUS), dtype=bool), 1 - steps * (0.07 + 0.06 * s))
    return w


def one_gpu_heatsink_loose(rng, hw, n):
    """One GPU's heatsink has come loose: from the onset it warms by 15-25 C over two to four
    minutes, and from halfway up that climb it loses clock, 10-25 % by the top; every step waits
    for it."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 60)
    s = severity_of(w)
    ramp = w.after(rng.integers(24, 49, n))
    gpu = some_gpus(w, 1, 1)
    w.temp = np.where(gpu[:, None, :], np.rint(w.temp + ramp[:, :, None] * (15 + 10 * s[:, :, None])), w.temp)
    held = np.clip(ramp * 2 - 1, 0, 1)
    gpus_slower(w, gpu, 1 - held * (0.1 + 0.15 * s))
    return w


# name -> (class, family)
SET11: dict[str, tuple[str, Family]] = {
    "healthy.async_local_checkpoint": ("healthy", healthy_async_local_checkpoint),
    "healthy.shared_leaf_bursts": ("healthy", healthy_shared_leaf_bursts),
    "healthy.small_batch_inference_boost": ("healthy", healthy_small_batch_inference_boost),
    "communication.hca_firmware_hang": ("communication", hca_firmware_hang),
    "communication.in_network_reduction_off": ("communication", in_network_reduction_off),
    "storage.fuse_mount_stalls": ("storage", fuse_mount_stalls),
    "storage.drive_latency_spikes": ("storage", drive_latency_spikes),
    "compute.bmc_power_budget_steps": ("compute", bmc_power_budget_steps),
    "compute.one_gpu_heatsink_loose": ("compute", one_gpu_heatsink_loose),
}
