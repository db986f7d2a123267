"""The fifth clean hold-out's nine families (fresh set 5). They were written before the model of
generator version 5 was trained and scored it once (macro-F1 0.675, 18.2 % of healthy episodes with
a finding: a drive's PCIe link errors and a GPU's periodic stalls read as communication faults, an
epoch boundary's one input stall as a storage fault; benchmarks/results/model_fresh_history.json).
Since generator version 6 they are training families (stethoscope_training.episodes.FAMILIES);
stethoscope_training.fresh holds the current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
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


def healthy_epoch_boundary(rng, hw, n):
    """An epoch ends inside the window: the data loader reshuffles and restarts its workers, so for
    2-6 samples each step waits one to six steps' time for its input and the GPUs idle meanwhile;
    the drive warms a little while the new shards are read. Then the job goes on as before."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    start = rng.integers(10, STEPS - 10, (n, 1))
    reshuffle = (t >= start) & (t < start + rng.integers(2, 7, (n, 1)))
    input_slower(w, w.step_ms * reshuffle * rng.uniform(1, 6, (n, 1)))
    disk_warmer(w, reshuffle.astype(float), rng.uniform(1, 3, (n, 1)))
    return w


def healthy_boost_below_cap(rng, hw, n):
    """A job whose kernels never reach the power limit (a memory-bound model, a small hidden size):
    the GPUs are busy but draw 55-85 % of the way from idle to the cap, run cooler, and boost their
    clocks to or near the maximum. Steady over the window."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    level = rng.uniform(0.55, 0.85, (n, 1, 1))
    w.power = hw.idle_power + (w.power - hw.idle_power) * level
    boost = hw.max_clock - rng.uniform(0, 3, (n, 1, 1)) * hw.clock_step + rng.normal(0, 10, w.clock.shape)
    w.clock = np.minimum(hw.clock_step * np.rint(boost / hw.clock_step), hw.max_clock)
    w.temp = np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.3 + 0.7 * level))
    w.util = np.clip(w.util - np.rint(rng.uniform(0, 12, (n, 1, 1))), 0, 100)
    return w


def healthy_collective_heavy(rng, hw, n):
    """A data-parallel job with large gradients on a small batch: its collectives take some 30-50 %
    of every step from start to end, the IB ports wait to send 3-10 times as long as a typical job's,
    and the GPUs sit idle in the collectives' share. Steady over the window."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    share = rng.uniform(0.4, 0.6, (n, 1))
    compute = w.step_ms - w.comm_ms
    w.comm_ms = w.comm_ms * share / np.maximum(w.comm_ms / w.step_ms, 1e-3)
    w.step_ms = compute + w.comm_ms
    busy = (compute / w.step_ms)[:, :, None]
    w.util = np.rint(w.util * (0.3 + 0.7 * busy))
    w.power = hw.idle_power + (w.power - hw.idle_power) * (0.5 + 0.5 * busy)
    port_waits_longer(w, rng.uniform(3, 10, (n, 1)))
    return w


# --- communication -----------------------------------------------------------------------------


def sm_resweep_stalls(rng, hw, n):
    """The subnet manager sweeps the fabric again and again from the onset (a flapping port
    elsewhere): two to four times, for 1-3 samples, the job's collectives take 3-15 times as long
    while routes are reprogrammed and the ports wait to send; no error counter moves."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    stalled = np.zeros((n, STEPS), dtype=bool)
    for _ in range(3):  # besides the first, up to three more sweeps after it
        at = w.onset[:, None] + rng.integers(0, np.maximum(STEPS - w.onset, 1))[:, None]
        keep = rng.random((n, 1)) < 0.75
        stalled |= keep & (t >= at) & (t < at + rng.integers(1, 4, (n, 1)))
    stalled[np.arange(n), np.minimum(w.onset, STEPS - 1)] = True  # the first sweep at the onset
    stalled &= t >= w.onset[:, None]
    port_waits_longer(w, 1 + stalled * rng.uniform(5, 30, (n, 1)))
    collectives_slower(w, w.comm_ms * stalled * (2 + 13 * s))
    return w


def cable_ber_climb(rng, hw, n):
    """A cable whose bit-error rate climbs from the onset (a connector working loose): symbol errors
    rise tenfold every minute or two, the RDMA queue pairs start dropping once they pass a few a
    second, and the collectives slow as retransmissions grow."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 5, 70)
    s = severity_of(w)
    ramp = w.after(rng.integers(30, 90, n))
    symbols = 10 ** (-1 + (1.5 + 2.5 * s) * ramp)
    counter_rate(w, "ib_symbol_errors_per_second", symbols, (ramp > 0).astype(float))
    drops = np.clip(symbols - 3, 0, None) * rng.uniform(0.1, 0.4, (n, 1))
    counter_rate(w, "rdma_qps_dropped_per_second", drops, (drops > 0).astype(float))
    collectives_slower(w, w.comm_ms * ramp * (0.1 + 0.8 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def prefetch_starvation(rng, hw, n):
    """The data set was moved to a slower tier: the loader's prefetch queue drains faster than it
    fills, so from the onset the input wait builds up over 8-25 samples, drops when a large read
    lands, and builds up again (a saw tooth); the local drive is not involved."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = np.clip(t - w.onset[:, None], 0, None)
    tooth = (since % rng.integers(8, 26, (n, 1))) / 25.0
    extra = w.step_ms * (t >= w.onset[:, None]) * (0.1 + tooth * (0.3 + 1.5 * s))
    input_slower(w, extra * rng.lognormal(0, 0.15, (n, STEPS)))
    return w


def nvme_link_errors(rng, hw, n):
    """The local drive's PCIe link starts taking correctable errors (a marginal riser): AER counts
    rise from the onset and the drive's replayed transfers make the job wait longer for its input;
    the drive a degree or two warmer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 10, n))
    counter_rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.3 + 2 * s), on)
    extra = w.step_ms * on * (0.15 + 1.2 * s) * rng.lognormal(0, 0.25, (n, STEPS))
    input_slower(w, extra)
    disk_warmer(w, on, rng.uniform(1, 2, (n, 1)))
    return w


# --- compute -----------------------------------------------------------------------------------


def two_gpus_clock_capped(rng, hw, n):
    """An operator's clock lock (nvidia-smi -lgc) left on two GPUs after a test: from the onset they
    run at 55-85 % of their clock and draw less, and every step waits for them."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    gpus_slower(w, some_gpus(w, 2, 2), 1 - on * (0.15 + 0.3 * s))
    return w


def gpu_periodic_stalls(rng, hw, n):
    """One GPU stalls now and then (the driver retiring pages after correctable ECC errors): from
    the onset, every 4-12 samples, for one sample its utilisation and power fall towards idle and
    that step takes 1.5-4 times as long, the other GPUs waiting in the collective."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = t - w.onset[:, None]
    stall = (since >= 0) & (since % rng.integers(4, 13, (n, 1)) == 0)
    gpu = some_gpus(w, 1, 1)[:, None, :]
    depth = stall[:, :, None] * rng.uniform(0.6, 1.0, (n, 1, 1))
    w.util = np.where(gpu, np.rint(w.util * (1 - depth)), w.util)
    w.power = np.where(gpu, w.power - (w.power - hw.idle_power) * depth * 0.7, w.power)
    extra = w.step_ms * stall * (0.5 + 2.5 * s)
    others_wait(w, gpu, extra)
    return w


# name -> (class, family)
SET5: dict[str, tuple[str, Family]] = {
    "healthy.epoch_boundary": ("healthy", healthy_epoch_boundary),
    "healthy.boost_below_cap": ("healthy", healthy_boost_below_cap),
    "healthy.collective_heavy": ("healthy", healthy_collective_heavy),
    "communication.sm_resweep_stalls": ("communication", sm_resweep_stalls),
    "communication.cable_ber_climb": ("communication", cable_ber_climb),
    "storage.prefetch_starvation": ("storage", prefetch_starvation),
    "storage.nvme_link_errors": ("storage", nvme_link_errors),
    "compute.two_gpus_clock_capped": ("compute", two_gpus_clock_capped),
    "compute.gpu_periodic_stalls": ("compute", gpu_periodic_stalls),
}
