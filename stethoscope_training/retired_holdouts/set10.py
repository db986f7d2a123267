"""The tenth clean hold-out's nine families (fresh set 10). They were written before the model of
generator version 10 was trained and scored it (macro-F1 0.977, 0.17 % of healthy episodes with a
finding; benchmarks/results/model_fresh_history.json; again, with the detector recalibrated and the
classifier unchanged, in model_fresh_set10.json: the same). The same model was then scored on fresh
set 11, to see whether set 10's result held on families written after it. Since generator version 11
both sets are training families (stethoscope_training.episodes.FAMILIES)."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    GPUS,
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


def healthy_spot_preemption_drain(rng, hw, n):
    """The scheduler drains the node for maintenance at a step in the window: the job finishes its
    step, saves and exits; the GPUs go idle and cool, the job reports no more; nothing is wrong."""
    t = np.arange(STEPS)[None, :]
    end = rng.integers(20, STEPS - 10, (n, 1))
    w = healthy_window(rng, hw, n, (t < end).astype(float))
    saving = (t >= end - rng.integers(1, 4, (n, 1))) & (t < end)
    input_slower(w, w.step_ms * saving * rng.uniform(0.2, 1.0, (n, 1)))
    return w


def healthy_sequence_length_warmup(rng, hw, n):
    """A curriculum that lengthens the sequences step by step over the window: each step takes a
    little longer than the one before (by a third to double over ten minutes), the collectives as
    long as before, the GPUs as busy."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :] / (STEPS - 1)
    compute = w.step_ms - w.comm_ms
    w.step_ms = compute * (1 + t * rng.uniform(0.33, 1.0, (n, 1))) + w.comm_ms
    return w


def healthy_shared_node_light_neighbour(rng, hw, n):
    """A second, light job shares the node's network (a small inference service on the spare
    GPUs): the ports wait a little more to send, two to three times as long, from start to end, and
    this job's collectives are 5-15 % slower than alone, steadily."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    port_waits_longer(w, rng.uniform(2, 3, (n, 1)))
    collectives_slower(w, w.comm_ms * rng.uniform(0.05, 0.15, (n, 1)))
    return w


# --- communication -----------------------------------------------------------------------------


def ber_bursts_with_retransmits(rng, hw, n):
    """A transceiver whose laser is dying: from the onset, bursts of symbol errors every minute or
    so, each followed by RDMA drops and a collective two to six times as slow."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = t - w.onset[:, None]
    burst = (since >= 0) & (since % rng.integers(8, 16, (n, 1)) < rng.integers(1, 3, (n, 1)))
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (0.7 + 1.5 * s), burst.astype(float))
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.3 + 1.2 * s), burst.astype(float))
    collectives_slower(w, w.comm_ms * burst * (1 + 5 * s))
    return w


def rank_on_slow_peer(rng, hw, n):
    """The job's ring passes through a node whose network is slow (its own fault, not this node's):
    from the onset every collective here waits for it, 40 % to three times as long, and this node's
    port waits less to send (its partner takes less); nothing else moves here."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 8, n))
    port_waits_longer(w, 1 - on * rng.uniform(0.2, 0.6, (n, 1)))
    collectives_slower(w, w.comm_ms * on * (0.4 + 1.6 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def nvme_namespace_full(rng, hw, n):
    """The local scratch namespace fills up during the window: past 95 % the drive's free blocks
    run out, garbage collection runs all the time, and the job's reads wait longer and longer (a
    ramp over two to five minutes), the drive 3-8 C warmer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 60)
    s = severity_of(w)
    ramp = w.after(rng.integers(24, 61, n))
    input_slower(w, ramp * (w.data_ms * (1 + 4 * s) + w.step_ms * (0.05 + 0.5 * s)))
    disk_warmer(w, ramp, rng.uniform(3, 8, (n, 1)))
    return w


def dataloader_worker_crashloop(rng, hw, n):
    """The data loader's workers die and respawn from the onset (an out-of-memory on a corrupt
    sample that keeps coming back): each respawn stalls the input for a few seconds, every
    30-90 s, and the steps in those samples take twice to five times as long."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = t - w.onset[:, None]
    respawn = (since >= 0) & (since % rng.integers(6, 19, (n, 1)) == 0)
    input_slower(w, respawn * w.step_ms * (1 + 4 * s))
    return w


# --- compute -----------------------------------------------------------------------------------


def gpu_sram_ecc_storm(rng, hw, n):
    """One GPU takes a storm of correctable SRAM errors from the onset: the corrections cost its
    kernels time, so it is 5-30 % slower at the same clock, draws a little less, runs a little
    cooler, and the other GPUs wait for it in every collective."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 10, n))
    gpu = some_gpus(w, 1, 1)[:, None, :]
    extra = w.step_ms * on * (0.05 + 0.25 * s)
    share = (w.step_ms / (w.step_ms + extra))[:, :, None]
    w.power = np.where(gpu, hw.idle_power + (w.power - hw.idle_power) * (0.9 + 0.1 * share), w.power)
    w.temp = np.where(gpu, np.rint(w.temp - on[:, :, None] * 2), w.temp)
    others_wait(w, gpu, extra)
    return w


def cooling_loop_pump_slow(rng, hw, n):
    """The liquid cooling loop's pump slows at the onset: every GPU warms steadily by 10-20 C over
    five minutes; once the hottest passes its slowdown temperature, every GPU that has passed it
    loses clock as the hottest does, up to 10-30 %."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 40)
    s = severity_of(w)
    ramp = w.after(rng.integers(40, 80, n))
    w.temp = np.rint(
        w.temp + ramp[:, :, None] * (10 + 10 * s[:, :, None]) * rng.uniform(0.8, 1.2, (n, 1, GPUS))
    )
    hot = np.clip((w.temp - (hw.load_temp + 14)) / 6, 0, 1)
    gpus = hot.max(axis=1) > 0
    gpus_slower(w, gpus, 1 - hot.max(axis=2) * (0.1 + 0.2 * s))
    return w


# name -> (class, family)
SET10: dict[str, tuple[str, Family]] = {
    "healthy.spot_preemption_drain": ("healthy", healthy_spot_preemption_drain),
    "healthy.sequence_length_warmup": ("healthy", healthy_sequence_length_warmup),
    "healthy.shared_node_light_neighbour": ("healthy", healthy_shared_node_light_neighbour),
    "communication.ber_bursts_with_retransmits": ("communication", ber_bursts_with_retransmits),
    "communication.rank_on_slow_peer": ("communication", rank_on_slow_peer),
    "storage.nvme_namespace_full": ("storage", nvme_namespace_full),
    "storage.dataloader_worker_crashloop": ("storage", dataloader_worker_crashloop),
    "compute.gpu_sram_ecc_storm": ("compute", gpu_sram_ecc_storm),
    "compute.cooling_loop_pump_slow": ("compute", cooling_loop_pump_slow),
}
