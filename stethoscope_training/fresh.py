"""Fresh families (set 14): the clean hold-out of generator version 13, written before that model was
trained, from what these conditions look like on a real node rather than from the training families;
no training, validation or model selection has seen them. (Sets 1-13, the hold-outs of generator
versions 1-12, are training data now: stethoscope_training/retired_holdouts/.) Same signals,
aggregation, sample loss and masking as stethoscope_training.episodes; split "fresh". Scored by
benchmarks/model_fresh_families.py, once per model."""

from __future__ import annotations

import importlib

import numpy as np

from stethoscope.model.metadata import CLASSES, STEPS
from stethoscope_training.episodes import ARRAYS, Episodes, assemble, data_hash, hardware, manifest
from stethoscope_training.families import (
    CAPTURE,
    Capture,
    F,
    Family,
    Window,
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

SPLIT = "fresh"
SET = 14  # its salt (`salt`) keeps its streams apart from episodes.generate's and earlier sets'


# --- healthy -----------------------------------------------------------------------------------


def healthy_activation_recompute(rng, hw, n):
    """A job that recomputes its activations in the backward pass (activation checkpointing, to fit a
    longer sequence): all window long the part of each step outside its collectives takes 25-40 %
    longer than a job of its size would take, with the GPUs as busy, as hot and as close to the cap
    as ever, and its collectives and input as long as before; nothing is wrong."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    compute = w.step_ms - w.comm_ms
    w.step_ms = w.comm_ms + compute * rng.uniform(1.25, 1.4, (n, 1))
    return w


def healthy_fully_sharded_gathers(rng, hw, n):
    """A fully sharded (ZeRO-3 / FSDP) job gathers every layer's parameters before using them: its
    collectives take 45-70 % of each step, mostly hidden behind the compute, so the GPUs stay 85-97 %
    busy; the ports carry two to four times a typical job's traffic and wait that much longer to
    send, varying more from sample to sample (a spread of 0.3-0.5). The same all window long."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    share = rng.uniform(0.45, 0.7, (n, 1))
    w.comm_ms = w.comm_ms * share / np.median(w.comm_ms / w.step_ms, axis=1, keepdims=True)
    spread = rng.uniform(0.3, 0.5, (n, 1))
    port_waits_longer(w, rng.uniform(2, 4, (n, 1)) * rng.lognormal(0, 1, (n, STEPS)) ** spread)
    w.util = np.rint(w.util * rng.uniform(0.9, 0.97, (n, 1, 1)))
    return w


def healthy_loss_scale_skipped_steps(rng, hw, n):
    """Mixed-precision training whose loss scaler overflows now and then: a skipped step runs no
    optimizer update and takes 10-25 % less, one sample in 12-30 at random; the GPUs stay busy
    throughout. Nothing is wrong."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    skipped = rng.random((n, STEPS)) < 1 / rng.uniform(12, 30, (n, 1))
    w.step_ms = np.where(skipped, w.step_ms * (1 - rng.uniform(0.1, 0.25, (n, 1))), w.step_ms)
    return w


# --- communication -----------------------------------------------------------------------------


def qp_retry_exhausted_reconnects(rng, hw, n):
    """From the onset the fabric drops a packet now and then on this node's path, an RDMA queue pair
    runs out of retries and NCCL tears it down and reconnects: every 30 s to two minutes a collective
    stalls for 1.4-6 s, the port counts a few dropped packets then (4-15 a second, bursty) and waits
    less to send while the queue pair is rebuilt; between the reconnects everything is as before."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    every = rng.integers(6, 25, (n, 1))
    hit = ((t - w.onset[:, None]) % every == 0) & (t >= w.onset[:, None])
    stall = 1000 + 5000 * s * rng.uniform(0.5, 1.0, (n, STEPS))
    collectives_slower(w, hit * stall)
    port_waits_longer(w, np.where(hit, rng.uniform(0.3, 0.7, (n, 1)), 1.0))
    counter_rate(w, "rdma_qps_dropped_per_second", 2 + 13 * s, hit.astype(float))
    return w


def nic_pcie_link_retrained_narrow(rng, hw, n):
    """The PCIe link between the NIC and its switch takes a burst of correctable errors at the onset
    (32-100 a second for 10-20 s) and retrains at half its width: from then on the NIC moves data at
    half the rate, so the collectives take 35-90 % longer and the port, fed more slowly, waits a
    third to half as long to send; no error is counted after the burst."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 90)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    burst = (t >= w.onset[:, None]) & (t < w.onset[:, None] + rng.integers(2, 5, (n, 1)))
    counter_rate(w, "pcie_aer_correctable_errors_per_second", 20 + 80 * s, burst.astype(float))
    after = w.after()
    port_waits_longer(w, 1 - after * (0.5 + 0.17 * s))
    collectives_slower(w, w.comm_ms * after * (0.25 + 0.65 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def local_cache_miss_remote_fetch(rng, hw, n):
    """The node's local dataset cache is evicted at the onset (another job filled the drive) and the
    loader fetches every sample from the object store instead: within half a minute the input takes
    4.4-12 times as long, varying widely from sample to sample (a spread of 0.6), and the step with
    it; the local drive, idle now, cools by 2-5 C over 100-245 s."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s, on = severity_of(w), w.after(rng.integers(1, 6, n))
    slower = w.data_ms * on * (2 + 9 * s) * rng.lognormal(0, 0.6, (n, STEPS))
    input_slower(w, slower)
    disk = F["disk_temperature_celsius"]
    cooled = w.after(rng.integers(20, 50, n)) * rng.uniform(2, 5, (n, 1))
    w.node[:, :, disk] = np.rint(w.node[:, :, disk] - cooled)
    return w


def readahead_lost_after_remount(rng, hw, n):
    """The data volume is remounted at the onset (an automount timeout) without its tuned readahead:
    from then on every sample's read is several small requests, each waiting its turn: the input
    wait grows by one to three times itself plus 9-30 % of a step, steadily, and the step by as
    much, the GPUs waiting meanwhile; the drive is as warm as before and nothing is counted."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 90)
    s, on = severity_of(w), w.after()
    input_slower(w, on * (w.data_ms * (0.6 + 2.4 * s) + w.step_ms * (0.05 + 0.25 * s)))
    return w


# --- compute -----------------------------------------------------------------------------------


def numa_misbind_after_restart(rng, hw, n):
    """The job restarts inside the window (the GPUs idle 10-30 s) and the launcher, after a BIOS
    change renumbered the NUMA nodes, binds its host threads to the socket far from the GPUs: from
    then on every step takes 15-45 % longer, the GPUs waiting for the host between kernels
    (utilisation and power fall with the step, clocks hold), while the collectives and the input
    take as long as before."""
    t = np.arange(STEPS)[None, :]
    end = rng.integers(15, STEPS - 30, (n, 1))
    start = end + rng.integers(2, 7, (n, 1))
    w = healthy_window(rng, hw, n, ((t < end) | (t >= start)).astype(float))
    w.onset, w.severity = start[:, 0], rng.uniform(0.15, 1.0, n)
    step_slower(w, w.step_ms * (t >= start) * (0.1 + 0.35 * severity_of(w)))
    return w


def one_gpu_temperature_sensor_frozen(rng, hw, n):
    """One GPU's temperature reading freezes at the onset (a sensor fault) while its cooling fails
    with it: the reading stays where it was, but the GPU heats and its firmware pulls its clock down
    by 8-25 % over the next one to four minutes, its power with it; every step waits for it and the
    other GPUs idle in the collectives meanwhile."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    gpu = some_gpus(w, 1, 1)
    frozen = w.temp[np.arange(n), w.onset][:, None, :]
    after = (np.arange(STEPS)[None, :] >= w.onset[:, None])[:, :, None]
    w.temp = np.where(gpu[:, None, :] & after, frozen, w.temp)
    gpus_slower(w, gpu, 1 - w.after(rng.integers(12, 48, n)) * (0.05 + 0.2 * s))
    return w


# name -> (class, family); none of these names is a training family's (episodes.FAMILIES)
FRESH: dict[str, tuple[str, Family]] = {
    "healthy.activation_recompute": ("healthy", healthy_activation_recompute),
    "healthy.fully_sharded_gathers": ("healthy", healthy_fully_sharded_gathers),
    "healthy.loss_scale_skipped_steps": ("healthy", healthy_loss_scale_skipped_steps),
    "communication.qp_retry_exhausted_reconnects": ("communication", qp_retry_exhausted_reconnects),
    "communication.nic_pcie_link_retrained_narrow": ("communication", nic_pcie_link_retrained_narrow),
    "storage.local_cache_miss_remote_fetch": ("storage", local_cache_miss_remote_fetch),
    "storage.readahead_lost_after_remount": ("storage", readahead_lost_after_remount),
    "compute.numa_misbind_after_restart": ("compute", numa_misbind_after_restart),
    "compute.one_gpu_temperature_sensor_frozen": ("compute", one_gpu_temperature_sensor_frozen),
}


def salt(fresh_set: int) -> int:
    """The seed salt of a fresh set (sets 4 on): 20261200 + its number."""
    return 20261200 + fresh_set


def families_of(fresh_set: int) -> dict[str, tuple[str, Family]]:
    """The families of a fresh set: this module's for the current one, an earlier set's from
    stethoscope_training/retired_holdouts/setNN.py (ValueError when there is none)."""
    if fresh_set == SET:
        return FRESH
    try:
        module = importlib.import_module(f"stethoscope_training.retired_holdouts.set{int(fresh_set):02d}")
        return getattr(module, f"SET{int(fresh_set)}")
    except (ImportError, AttributeError):
        missing = f"stethoscope_training/retired_holdouts/set{int(fresh_set):02d}.py"
        raise ValueError(f"fresh set {fresh_set}: no {missing}") from None


def generate(
    seed: int = 7,
    per_family: int = 200,
    hw_class: str = "h200",
    capture: Capture | None = None,
    fresh_set: int = SET,
) -> Episodes:
    """per_family episodes of every family of a fresh set (the current one unless `fresh_set` names
    an earlier one, to score another model on it), all in split "fresh"; deterministic for a seed."""
    chosen = families_of(fresh_set)
    _, _, hw = hardware(hw_class, per_family, capture)
    root = np.random.SeedSequence([seed, 0 if hw_class == "h200" else 1, salt(fresh_set)])
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ARRAYS}
    for (name, (cls, family)), stream in zip(chosen.items(), root.spawn(len(chosen)), strict=True):
        window: Window = family(np.random.default_rng(stream), hw, per_family)
        x, mask = assemble(window)
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
        "fresh_set": fresh_set,
        "per_family": dict.fromkeys(chosen, per_family),
        "families_per_split": {SPLIT: sorted(chosen)},
        "calibrated_on": str(CAPTURE),
        "data_hash": data_hash(arrays),
    }
    return Episodes(**arrays, info=info)
