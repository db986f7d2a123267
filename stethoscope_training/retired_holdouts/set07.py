"""The seventh clean hold-out's nine families (fresh set 7). They were written before the model of
generator version 7 was trained and scored it once (macro-F1 0.889, 21.3 % of healthy episodes with
a finding: gradient accumulation's alternating collectives read as a communication fault;
benchmarks/results/model_fresh_history.json). Since generator version 8 they are training families
(stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
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
)
from stethoscope_training.families_healthy_variety import load_following

# --- healthy -----------------------------------------------------------------------------------


def healthy_gradient_accumulation(rng, hw, n):
    """A job that accumulates gradients over 2-8 micro-steps and synchronises only on the last: the
    step time reported is now a short micro-step without collectives, now the long synchronising
    step whose collectives take most of it, in no pattern a 5-s sample can follow."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    sync = rng.random((n, STEPS)) < 1 / rng.integers(2, 9, (n, 1))
    micro = w.step_ms - w.comm_ms
    w.step_ms = np.where(sync, micro + w.comm_ms * rng.uniform(2, 4, (n, 1)), micro)
    w.comm_ms = np.where(sync, w.step_ms - micro, w.comm_ms * rng.uniform(0.0, 0.1, (n, STEPS)))
    return w


def healthy_inference_ramp(rng, hw, n):
    """An inference service as its traffic builds up (the morning): GPU load climbs from a third to
    nine tenths over the window with the request rate, batches grow and each step takes longer
    (20-80 % by the end); no collectives to speak of."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :] / (STEPS - 1)
    low, high = rng.uniform(0.25, 0.4, (n, 1)), rng.uniform(0.8, 0.95, (n, 1))
    level = low + (high - low) * t + rng.normal(0, 0.04, (n, STEPS))
    load_following(w, np.clip(level, 0.05, 1.0))
    w.step_ms = w.step_ms * (1 + t * rng.uniform(0.2, 0.8, (n, 1)))
    w.comm_ms = w.step_ms * rng.uniform(0.0, 0.03, (n, 1))
    return w


def healthy_scheduled_trim(rng, hw, n):
    """The weekly fstrim (or a scheduled drive self-test) runs for one to three minutes: the drive
    works and warms by 3-6 C, and the job's reads wait 10-30 % longer meanwhile; then all is as
    before."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    start = rng.integers(0, STEPS - 36, (n, 1))
    trim = (t >= start) & (t < start + rng.integers(12, 37, (n, 1)))
    disk_warmer(w, trim.astype(float), rng.uniform(3, 6, (n, 1)))
    w.data_ms = np.where(trim, w.data_ms * rng.uniform(1.1, 1.3, (n, 1)), w.data_ms)
    return w


# --- communication -----------------------------------------------------------------------------


def ecn_disabled_incast(rng, hw, n):
    """Congestion control lost on the job's switch after a change at the onset (ECN marking off):
    incast builds up, the ports wait 3-10 times as long to send and the collectives stretch by a
    fifth to three times, with a long tail; nothing is dropped."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(5, 30, n))
    port_waits_longer(w, 1 + on * rng.uniform(2, 9, (n, 1)))
    tail = rng.lognormal(0, 0.5, (n, STEPS))
    collectives_slower(w, w.comm_ms * on * (0.2 + 2.0 * s) * tail)
    return w


def optic_receive_drops(rng, hw, n):
    """An optic whose receive power is fading: packets fail their CRC and the RDMA queue pairs drop
    them in bursts, with no symbol errors counted (the lanes keep their lock); the collectives in
    those samples stretch."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    burst = w.after() * burst_steps(w, on=2, off=6)
    counter_rate(w, "rdma_qps_dropped_per_second", 10 ** (0.5 + 2 * s), burst)
    collectives_slower(w, w.comm_ms * burst * (0.3 + 1.5 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def shared_fs_failover(rng, hw, n):
    """The shared file system's server fails over at the onset: the job's reads block for 30-90 s
    (a step takes many times as long, the GPUs idle), then go on from a cold cache, a little slower
    than before; the local drive is not involved."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 90)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    blocked = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(6, 19, (n, 1)))
    after = (t >= w.onset[:, None]) & ~blocked
    extra = w.step_ms * (blocked * (3 + 10 * s) + after * (0.1 + 0.4 * s))
    input_slower(w, extra)
    return w


def metadata_storm(rng, hw, n):
    """Another job walks millions of files on the shared file system from the onset: this job's
    opens and reads queue at the metadata server, its input waits one and a half to four times as
    long and varies a lot; the local drive is not involved."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(2, 15, n))
    factor = (0.5 + 3 * s) * rng.lognormal(0, 0.5, (n, STEPS))
    input_slower(w, (w.data_ms * factor + w.step_ms * (0.05 + 0.3 * s)) * on)
    return w


# --- compute -----------------------------------------------------------------------------------


def thermal_paste_degraded(rng, hw, n):
    """One GPU's thermal paste has dried out: it runs 8-15 C hotter than its neighbours throughout,
    and from the onset, when the load rises a little, it crosses its slowdown temperature now and
    then and its clock drops by 5-20 % in those samples."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    gpu = some_gpus(w, 1, 1)
    w.temp = np.where(gpu[:, None, :], w.temp + np.rint(rng.uniform(8, 15, (n, 1, 1))), w.temp)
    hot = w.after() * (rng.random((n, STEPS)) < 0.2 + 0.5 * s)
    w.temp = np.where(gpu[:, None, :], w.temp + 3 * hot[:, :, None], w.temp)
    gpus_slower(w, gpu, 1 - hot * (0.05 + 0.15 * s))
    return w


def vrm_clock_jitter(rng, hw, n):
    """A failing voltage regulator on one or two GPUs: from the onset their clock jitters downward by
    5-25 % from sample to sample, their power with it, and the steps get slower and noisier."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 10, n))
    drop = rng.uniform(0.0, 1.0, (n, STEPS)) * (0.05 + 0.2 * s)
    gpus_slower(w, some_gpus(w, 1, 2), 1 - on * drop)
    return w


# name -> (class, family)
SET7: dict[str, tuple[str, Family]] = {
    "healthy.gradient_accumulation": ("healthy", healthy_gradient_accumulation),
    "healthy.inference_ramp": ("healthy", healthy_inference_ramp),
    "healthy.scheduled_trim": ("healthy", healthy_scheduled_trim),
    "communication.ecn_disabled_incast": ("communication", ecn_disabled_incast),
    "communication.optic_receive_drops": ("communication", optic_receive_drops),
    "storage.shared_fs_failover": ("storage", shared_fs_failover),
    "storage.metadata_storm": ("storage", metadata_storm),
    "compute.thermal_paste_degraded": ("compute", thermal_paste_degraded),
    "compute.vrm_clock_jitter": ("compute", vrm_clock_jitter),
}
