"""Fresh families (set 5): a clean hold-out for the shipped model. Written before the model of
generator version 5 was trained, from what these conditions look like on a real node rather than
from the training families; no training, validation or model selection has seen them. (Sets 1-4,
the hold-outs of generator versions 1-4, are training data now: families_set1..4.) Same
signals, aggregation, sample loss and masking as stethoscope.model.episodes; split "fresh". Scored
by benchmarks/model_fresh_families.py, once per model."""

from __future__ import annotations

import numpy as np

from stethoscope.model.episodes import ARRAYS, Episodes, _assemble, data_hash, hardware, manifest
from stethoscope.model.families import (
    CAPTURE,
    Capture,
    Family,
    Window,
    _base,
    _busy,
    _collectives_slower,
    _disk_warm,
    _fault,
    _gpu_slow,
    _input_slower,
    _port_waits,
    _rate,
    _sev,
    _some_gpus,
)
from stethoscope.model.metadata import CLASSES, STEPS

SPLIT = "fresh"
SET = 5
SALT = 20261205  # keeps the fresh streams apart from episodes.generate's (and earlier sets') for a seed


# --- healthy -----------------------------------------------------------------------------------


def healthy_epoch_boundary(rng, hw, n):
    """An epoch ends inside the window: the data loader reshuffles and restarts its workers, so for
    2-6 samples each step waits one to six steps' time for its input and the GPUs idle meanwhile;
    the drive warms a little while the new shards are read. Then the job goes on as before."""
    w = _base(rng, hw, n, _busy(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    start = rng.integers(10, STEPS - 10, (n, 1))
    reshuffle = (t >= start) & (t < start + rng.integers(2, 7, (n, 1)))
    _input_slower(w, w.step_ms * reshuffle * rng.uniform(1, 6, (n, 1)))
    _disk_warm(w, reshuffle.astype(float), rng.uniform(1, 3, (n, 1)))
    return w


def healthy_boost_below_cap(rng, hw, n):
    """A job whose kernels never reach the power limit (a memory-bound model, a small hidden size):
    the GPUs are busy but draw 55-85 % of the way from idle to the cap, run cooler, and boost their
    clocks to or near the maximum. Steady over the window."""
    w = _base(rng, hw, n, _busy(rng, n, "load"))
    level = rng.uniform(0.55, 0.85, (n, 1, 1))
    w.power = hw.idle_power + (w.power - hw.idle_power) * level
    boost = hw.max_clock - rng.uniform(0, 3, (n, 1, 1)) * hw.clock_step + rng.normal(0, 10, w.clock.shape)
    w.clock = np.minimum(hw.clock_step * np.rint(boost / hw.clock_step), hw.max_clock)
    w.temp = np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.3 + 0.7 * level))
    w.util = np.clip(w.util - np.rint(rng.uniform(0, 12, (n, 1, 1))), 0, 100)
    return w


def healthy_collective_heavy(rng, hw, n):
    """A data-parallel job with large gradients on a small batch: its collectives take 40-60 % of
    every step from start to end, the IB ports wait to send 3-10 times as long as a typical job's,
    and the GPUs sit idle in the collectives' share. Steady over the window."""
    w = _base(rng, hw, n, _busy(rng, n, "load"))
    share = rng.uniform(0.4, 0.6, (n, 1))
    compute = w.step_ms - w.comm_ms
    w.comm_ms = w.comm_ms * share / np.maximum(w.comm_ms / w.step_ms, 1e-3)
    w.step_ms = compute + w.comm_ms
    busy = (compute / w.step_ms)[:, :, None]
    w.util = np.rint(w.util * (0.3 + 0.7 * busy))
    w.power = hw.idle_power + (w.power - hw.idle_power) * (0.5 + 0.5 * busy)
    _port_waits(w, rng.uniform(3, 10, (n, 1)))
    return w


# --- communication -----------------------------------------------------------------------------


def sm_resweep_stalls(rng, hw, n):
    """The subnet manager sweeps the fabric again and again from the onset (a flapping port
    elsewhere): two to four times, for 1-3 samples, the job's collectives take 3-15 times as long
    while routes are reprogrammed and the ports wait to send; no error counter moves."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")), 10, 80)
    s = _sev(w)
    t = np.arange(STEPS)[None, :]
    stalled = np.zeros((n, STEPS), dtype=bool)
    for _ in range(3):  # besides the first, up to three more sweeps after it
        at = w.onset[:, None] + rng.integers(0, np.maximum(STEPS - w.onset, 1))[:, None]
        keep = rng.random((n, 1)) < 0.75
        stalled |= keep & (t >= at) & (t < at + rng.integers(1, 4, (n, 1)))
    stalled[np.arange(n), np.minimum(w.onset, STEPS - 1)] = True  # the first sweep at the onset
    stalled &= t >= w.onset[:, None]
    _port_waits(w, 1 + stalled * rng.uniform(5, 30, (n, 1)))
    _collectives_slower(w, w.comm_ms * stalled * (2 + 13 * s))
    return w


def cable_ber_climb(rng, hw, n):
    """A cable whose bit-error rate climbs from the onset (a connector working loose): symbol errors
    rise tenfold every minute or two, the RDMA queue pairs start dropping once they pass a few a
    second, and the collectives slow as retransmissions grow."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")), 5, 70)
    s = _sev(w)
    ramp = w.after(rng.integers(30, 90, n))
    symbols = 10 ** (-1 + (1.5 + 2.5 * s) * ramp)
    _rate(w, "ib_symbol_errors_per_second", symbols, (ramp > 0).astype(float))
    drops = np.clip(symbols - 3, 0, None) * rng.uniform(0.1, 0.4, (n, 1))
    _rate(w, "rdma_qps_dropped_per_second", drops, (drops > 0).astype(float))
    _collectives_slower(w, w.comm_ms * ramp * (0.1 + 0.8 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def prefetch_starvation(rng, hw, n):
    """The data set was moved to a slower tier: the loader's prefetch queue drains faster than it
    fills, so from the onset the input wait builds up over 8-25 samples, drops when a large read
    lands, and builds up again (a saw tooth); the local drive is not involved."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")), 10, 80)
    s = _sev(w)
    t = np.arange(STEPS)[None, :]
    since = np.clip(t - w.onset[:, None], 0, None)
    tooth = (since % rng.integers(8, 26, (n, 1))) / 25.0
    extra = w.step_ms * (t >= w.onset[:, None]) * (0.1 + tooth * (0.3 + 1.5 * s))
    _input_slower(w, extra * rng.lognormal(0, 0.15, (n, STEPS)))
    return w


def nvme_link_errors(rng, hw, n):
    """The local drive's PCIe link starts taking correctable errors (a marginal riser): AER counts
    rise from the onset and the drive's replayed transfers make the job wait longer for its input;
    the drive a degree or two warmer."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")))
    s, on = _sev(w), w.after(rng.integers(1, 10, n))
    _rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.3 + 2 * s), on)
    extra = w.step_ms * on * (0.15 + 1.2 * s) * rng.lognormal(0, 0.25, (n, STEPS))
    _input_slower(w, extra)
    _disk_warm(w, on, rng.uniform(1, 2, (n, 1)))
    return w


# --- compute -----------------------------------------------------------------------------------


def two_gpus_clock_capped(rng, hw, n):
    """An operator's clock lock (nvidia-smi -lgc) left on two GPUs after a test: from the onset they
    run at 55-85 % of their clock and draw less, and every step waits for them."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")))
    s, on = _sev(w), w.after()
    _gpu_slow(w, _some_gpus(w, 2, 2), 1 - on * (0.15 + 0.3 * s))
    return w


def gpu_periodic_stalls(rng, hw, n):
    """One GPU stalls now and then (the driver retiring pages after correctable ECC errors): from
    the onset, every 4-12 samples, for one sample its utilisation and power fall towards idle and
    that step takes 1.5-4 times as long, the other GPUs waiting in the collective."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")), 10, 80)
    s = _sev(w)
    t = np.arange(STEPS)[None, :]
    since = t - w.onset[:, None]
    stall = (since >= 0) & (since % rng.integers(4, 13, (n, 1)) == 0)
    gpu = _some_gpus(w, 1, 1)[:, None, :]
    depth = stall[:, :, None] * rng.uniform(0.6, 1.0, (n, 1, 1))
    w.util = np.where(gpu, np.rint(w.util * (1 - depth)), w.util)
    w.power = np.where(gpu, w.power - (w.power - hw.idle_power) * depth * 0.7, w.power)
    extra = w.step_ms * stall * (0.5 + 2.5 * s)
    waiting = (w.step_ms / (w.step_ms + extra))[:, :, None]
    w.util = np.where(gpu, w.util, np.rint(w.util * waiting))
    w.comm_ms = w.comm_ms + 0.7 * extra
    w.step_ms = w.step_ms + extra
    return w


# name -> (class, family); none of these names is a training family's (episodes.FAMILIES)
FRESH: dict[str, tuple[str, Family]] = {
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


def generate(
    seed: int = 7, per_family: int = 200, hw_class: str = "h200", capture: Capture | None = None
) -> Episodes:
    """per_family episodes of every fresh family, all in split "fresh"; deterministic for a seed."""
    _, _, hw = hardware(hw_class, per_family, capture)
    root = np.random.SeedSequence([seed, 0 if hw_class == "h200" else 1, SALT])
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ARRAYS}
    for (name, (cls, family)), stream in zip(FRESH.items(), root.spawn(len(FRESH)), strict=True):
        window: Window = family(np.random.default_rng(stream), hw, per_family)
        x, mask = _assemble(window)
        parts["x"].append(x)
        parts["mask"].append(mask)
        parts["label"].append(np.full(per_family, CLASSES.index(cls), dtype=np.int64))
        parts["family"].append(np.full(per_family, name, dtype="<U64"))
        parts["split"].append(np.full(per_family, SPLIT, dtype="<U16"))
        parts["hw_class"].append(np.full(per_family, hw.hw_class, dtype="<U32"))
        parts["onset"].append(window.onset.astype(np.int64))
        parts["severity"].append(window.severity.astype(np.float32))
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    info = {
        **manifest(seed, hw_class, hw),
        "fresh": True,
        "fresh_set": SET,
        "per_family": dict.fromkeys(FRESH, per_family),
        "families_per_split": {SPLIT: sorted(FRESH)},
        "calibrated_on": str(CAPTURE),
        "data_hash": data_hash(arrays),
    }
    return Episodes(**arrays, info=info)
