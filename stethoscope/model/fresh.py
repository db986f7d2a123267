"""Fresh families (set 8): a clean hold-out for the shipped model. Written before the model of
generator version 8 was trained, from what these conditions look like on a real node rather than
from the training families; no training, validation or model selection has seen them. (Sets 1-7,
the hold-outs of generator versions 1-7, are training data now: families_set1..7.) Same
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
    _bursts,
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
SET = 8
SALT = 20261208  # keeps the fresh streams apart from episodes.generate's (and earlier sets') for a seed


# --- healthy -----------------------------------------------------------------------------------


def healthy_checkpoint_upload(rng, hw, n):
    """Every few minutes the job uploads a checkpoint to object storage over the same fabric: for
    2-6 samples the IB ports wait 5-20 times as long to send and the collectives in those samples
    take 20-60 % longer; nothing dropped, nothing counted, on a schedule the job has kept all along."""
    w = _base(rng, hw, n, _busy(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.integers(36, 73, (n, 1))
    upload = (t + rng.integers(0, 72, (n, 1))) % period < rng.integers(2, 7, (n, 1))
    _port_waits(w, 1 + upload * rng.uniform(4, 19, (n, 1)))
    _collectives_slower(w, w.comm_ms * upload * rng.uniform(0.2, 0.6, (n, 1)))
    return w


def healthy_power_cap_clock_hunting(rng, hw, n):
    """GPUs at their power limit whose clocks hunt as the driver's power controller holds the cap:
    the clock moves 5-10 % from sample to sample while power stays at the cap and the job's pace
    holds."""
    w = _base(rng, hw, n, _busy(rng, n, "load"))
    hunt = 1 - rng.uniform(0, 1, w.clock.shape) * rng.uniform(0.05, 0.1, (n, 1, 1))
    w.clock = np.minimum(hw.clock_step * np.rint(w.clock * hunt / hw.clock_step), hw.max_clock)
    return w


def healthy_health_check_bursts(rng, hw, n):
    """An idle node between jobs that runs the site's GPU health check (a DCGM diagnostic) every
    minute or two: for 1-3 samples every GPU goes to full load and warms, then idles again; no job."""
    w = _base(rng, hw, n, _busy(rng, n, "idle"))
    t = np.arange(STEPS)[None, :]
    period = rng.integers(12, 25, (n, 1))
    check = ((t + rng.integers(0, 24, (n, 1))) % period < rng.integers(1, 4, (n, 1))).astype(float)
    busy = _base(rng, hw, n, _busy(rng, n, "load"))
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
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")), 10, 70)
    s = _sev(w)
    slow = w.after() * _bursts(w, on=20, off=15)
    _port_waits(w, 1 + slow * rng.uniform(1, 4, (n, 1)))
    _collectives_slower(w, w.comm_ms * slow * (0.5 + 1.5 * s))
    return w


def port_speed_downgrade(rng, hw, n):
    """The node's IB port retrains at a lower speed at the onset (a marginal cable, 4x to 2x): a
    burst of symbol errors while it retrains, then every collective is 1.5-4 times as slow and the
    port waits to send 2-8 times as long, with no further errors."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")))
    s = _sev(w)
    t = np.arange(STEPS)[None, :]
    retrain = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(1, 3, (n, 1)))
    after = t >= w.onset[:, None]
    _rate(w, "ib_symbol_errors_per_second", 10 ** (1 + 1.5 * s), retrain.astype(float))
    _port_waits(w, 1 + after * rng.uniform(1, 7, (n, 1)))
    _collectives_slower(w, w.comm_ms * after * (0.5 + 2.5 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def write_cache_disabled(rng, hw, n):
    """A maintenance script turns the local NVMe's volatile write cache off at the onset: the job's
    local shuffle buffer and cache writes slow, its input waits two to four times as long from then
    on, and the drive works a degree or three warmer."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")))
    s, on = _sev(w), w.after()
    _input_slower(w, on * (w.data_ms * (1 + 2 * s) + w.step_ms * (0.05 + 0.4 * s)))
    _disk_warm(w, on, rng.uniform(1, 3, (n, 1)))
    return w


def object_store_throttling(rng, hw, n):
    """The object store starts throttling the job's reads (503 SlowDown) from the onset: most reads
    are only a little slower, but more and more of them back off and retry for one to eight seconds;
    the local drive is not involved."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")), 10, 70)
    s = _sev(w)
    t = np.arange(STEPS)[None, :]
    since = np.clip(t - w.onset[:, None], 0, None)
    on = t >= w.onset[:, None]
    backoff = on & (rng.random((n, STEPS)) < 0.05 + (0.1 + 0.3 * s) * since / STEPS)
    extra = on * w.data_ms * (0.3 + s) + backoff * rng.uniform(1000, 8000, (n, STEPS))
    _input_slower(w, extra)
    return w


# --- compute -----------------------------------------------------------------------------------


def gpu_pcie_downshift(rng, hw, n):
    """One GPU's PCIe link comes back from a reset at a lower width at the onset: a few correctable
    errors while it trains, then its copies to and from the host take longer, it waits on them (less
    busy, less power) and every step waits for it, 10-40 % longer."""
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")))
    s, on = _sev(w), w.after()
    t = np.arange(STEPS)[None, :]
    training = (t >= w.onset[:, None]) & (t < w.onset[:, None] + 2)
    _rate(w, "pcie_aer_correctable_errors_per_second", 10 ** (0.5 + s), training.astype(float))
    gpu = _some_gpus(w, 1, 1)[:, None, :]
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
    w = _fault(_base(rng, hw, n, _busy(rng, n, "load")))
    on = w.after()
    factor = np.maximum(hw.idle_clock / hw.load_clock, 1 - on * (0.5 + 0.25 * _sev(w)))
    _gpu_slow(w, _some_gpus(w, 1, 1), factor)
    return w


# name -> (class, family); none of these names is a training family's (episodes.FAMILIES)
FRESH: dict[str, tuple[str, Family]] = {
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
