"""The eighth clean hold-out's nine families (fresh set 8). They were written before the model of
generator version 8 was trained and scored it once (macro-F1 0.905, 30.5 % of healthy episodes with
a finding: a scheduled checkpoint upload over the fabric read as a communication fault;
benchmarks/results/model_fresh_history.json). Since generator version 9 they are training families
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

# --- healthy -----------------------------------------------------------------------------------


def healthy_checkpoint_upload(rng, hw, n):
    """Every few minutes the job uploads a checkpoint to object storage over the same fabric: for
    2-6 samples the IB ports wait 5-20 times as long to send and the collectives in those samples
    take 20-60 % longer; nothing dropped, nothing counted, on a schedule the job has kept all along."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.integers(36, 73, (n, 1))
    upload = (t + rng.integers(0, 72, (n, 1))) % period < rng.integers(2, 7, (n, 1))
    port_waits_longer(w, 1 + upload * rng.uniform(4, 19, (n, 1)))
    collectives_slower(w, w.comm_ms * upload * rng.uniform(0.2, 0.6, (n, 1)))
    return w


def healthy_power_cap_clock_hunting(rng, hw, n):
    """GPUs at their power limit whose clocks hunt as the driver's power controller holds the cap:
    the clock moves 5-10 % from sample to sample while power stays at the cap and the job's pace
    holds."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    hunt = 1 - rng.uniform(0, 1, w.clock.shape) * rng.uniform(0.05, 0.1, (n, 1, 1))
    w.clock = np.minimum(hw.clock_step * np.rint(w.clock * hunt / hw.clock_step), hw.max_clock)
    return w


def healthy_health_check_bursts(rng, hw, n):
    """An idle node between jobs that runs the site's GPU health check (a DCGM diagnostic) every
    minute or two: for 1-3 samples every GPU goes to full load and warms, then idles again; no job."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "idle"))
    t = np.arange(STEPS)[None, :]
    period = rng.integers(12, 25, (n, 1))
    check = ((t + rng.integers(0, 24, (n, 1))) % period < rng.integers(1, 4, (n, 1))).astype(float)
    busy = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    c = check[:, :, None]
    w.util = np.rint(w.util + c * (busy.util - w.util))
    w.power = w.power + c * (busy.power - w.power)
    w.clock = w.clock + c * (busy.clock - w.clock)
    w.temp = np.rint(w.temp + c * 0.6 * (busy.temp - w.temp))
    return w


# --- communication -----------------------------------------------------------------------------


def adaptive_routing_flap(rng, hw, n):
    """Adaptive routing on the job's switches toggles from the onset (a fabric manager bug): the
    collectives run normally for a stretch, then 1.5-3 times as slow for 10-30 samples while the
    ports wait 2-5 times as long, and so on; nothing dropped or counted."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 70)
    s = severity_of(w)
    slow = w.after() * burst_steps(w, on=20, off=15)
    port_waits_longer(w, 1 + slow * rng.uniform(1, 4, (n, 1)))
    collectives_slower(w, w.comm_ms * slow * (0.5 + 1.5 * s))
    return w


def port_speed_downgrade(rng, hw, n):
    """The node's IB port retrains at a lower speed at the onset (a marginal cable, 4x to 2x): a
    burst of symbol errors while it retrains, then every collective is 1.5-4 times as slow and the
    port waits to send 2-8 times as long, with no further errors."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    retrain = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(1, 3, (n, 1)))
    after = t >= w.onset[:, None]
    counter_rate(w, "ib_symbol_errors_per_second", 10 ** (1 + 1.5 * s), retrain.astype(float))
    port_waits_longer(w, 1 + after * rng.uniform(1, 7, (n, 1)))
    collectives_slower(w, w.comm_ms * after * (0.5 + 2.5 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def write_cache_disabled(rng, hw, n):
    """A maintenance script turns the local NVMe's volatile write cache off at the onset: the job's
    local shuffle buffer and cache writes slow, its input waits two to four times as long from then
    on, and the drive works a degree or three warmer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    input_slower(w, on * (w.data_ms * (1 + 2 * s) + w.step_ms * (0.05 + 0.4 * s)))
    disk_warmer(w, on, rng.uniform(1, 3, (n, 1)))
    return w


def object_store_throttling(rng, hw, n):
    """The object store starts throttling the job's reads (503 SlowDown) from the onset: most reads
    are only a little slower, but more and more of them back off and retry for one to eight seconds;
    the local drive is not involved."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 70)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    since = np.clip(t - w.onset[:, None], 0, None)
    on = t >= w.onset[:, None]
    backoff = on & (rng.random((n, STEPS)) < 0.05 + (0.1 + 0.3 * s) * since / STEPS)
    extra = on * w.data_ms * (0.3 + s) + backoff * rng.uniform(1000, 8000, (n, STEPS))
    input_slower(w, extra)
    return w


# --- compute -----------------------------------------------------------------------------------


def gpu_pcie_downshift(rng, hw, n):
    """One GPU's PCIe link comes back from a reset at a lower width at the onset: a few correctable
    errors while it trains, then its copies to and from the host take longer, it waits on them (less
    busy, less power) and every step waits for it, 10-40 % longer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after()
    t = np.arange(STEPS)[None, :]
    training = (t >= w.onset[:, None]) & (t < w.onset[:, None] + 2)
    counter_rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.5 + s), training.astype(float))
    gpu = some_gpus(w, 1, 1)[:, None, :]
    extra = w.step_ms * on * (0.1 + 0.3 * s)
    share = (w.step_ms / (w.step_ms + extra))[:, :, None]
    w.util = np.where(gpu, np.rint(w.util * (0.5 + 0.5 * share)), np.rint(w.util * share))
    w.power = np.where(gpu, hw.idle_power + (w.power - hw.idle_power) * (0.4 + 0.6 * share), w.power)
    w.comm_ms = w.comm_ms + 0.6 * extra
    w.step_ms = w.step_ms + extra
    return w


def clock_stuck_idle(rng, hw, n):
    """After a driver hiccup at the onset one GPU's clock stays at its idle level though it is busy:
    it draws little power, and the job runs at its pace, every step two to four times as long."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    on = w.after()
    factor = np.maximum(hw.idle_clock / hw.load_clock, 1 - on * (0.5 + 0.25 * severity_of(w)))
    gpus_slower(w, some_gpus(w, 1, 1), factor)
    return w


# name -> (class, family)
SET8: dict[str, tuple[str, Family]] = {
    "healthy.checkpoint_upload": ("healthy", healthy_checkpoint_upload),
    "healthy.power_cap_clock_hunting": ("healthy", healthy_power_cap_clock_hunting),
    "healthy.health_check_bursts": ("healthy", healthy_health_check_bursts),
    "communication.adaptive_routing_flap": ("communication", adaptive_routing_flap),
    "communication.port_speed_downgrade": ("communication", port_speed_downgrade),
    "storage.write_cache_disabled": ("storage", write_cache_disabled),
    "storage.object_store_throttling": ("storage", object_store_throttling),
    "compute.gpu_pcie_downshift": ("compute", gpu_pcie_downshift),
    "compute.clock_stuck_idle": ("compute", clock_stuck_idle),
}
