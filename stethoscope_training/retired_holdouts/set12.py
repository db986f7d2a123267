"""The twelfth clean hold-out's nine families (fresh set 12). They were written before the model of
generator version 11 was trained and scored it once (macro-F1 0.765, 0.83 % of healthy episodes with
a finding: a parallel file system evicting its client read as healthy 84 % of the time, a host CPU
PROCHOT never read as compute, 198 of 200 as communication or storage;
benchmarks/results/model_fresh_history.json). Version 10 scored 0.780 / 0.50 % on it for comparison
(benchmarks/results/model_fresh_set12_by_version10.json). Since generator version 12 they are
training families (stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the
current hold-out."""

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

# --- healthy -----------------------------------------------------------------------------------


def healthy_fp8_switch_faster(rng, hw, n):
    """At a step in the window the job switches its matrix multiplies to FP8 (or a compiled kernel
    takes over): from then on the part of each step outside its collectives takes 20-40 % less (the
    step some 12-38 % less), its collectives take as long as before, and the GPUs stay as busy, as
    hot and as close to the cap; nothing is wrong."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    faster = t >= rng.integers(10, STEPS - 10, (n, 1))
    compute = w.step_ms - w.comm_ms
    w.step_ms = np.where(faster, w.comm_ms + compute * (1 - rng.uniform(0.2, 0.4, (n, 1))), w.step_ms)
    return w


def healthy_uneven_pipeline_stages(rng, hw, n):
    """A pipeline-parallel job whose first and last stages carry less work: two to four of the
    node's GPUs are some 52-80 % busy all window long, draw that much less power, run a few degrees
    cooler and boost a little higher; the step keeps its pace."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    light = some_gpus(w, 2, 4)[:, None, :]
    level = rng.uniform(0.55, 0.8, (n, 1, GPUS))
    w.util = np.where(light, np.rint(w.util * level), w.util)
    w.power = np.where(light, hw.idle_power + (w.power - hw.idle_power) * (0.2 + 0.8 * level), w.power)
    w.temp = np.where(light, np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.5 + 0.5 * level)), w.temp)
    boost = hw.clock_step * rng.integers(0, 4, (n, 1, GPUS))
    w.clock = np.where(light, np.minimum(w.clock + boost, hw.max_clock), w.clock)
    return w


def healthy_nccl_algorithm_switch(rng, hw, n):
    """At a step in the window the job's collectives change shape (a resumed run with another
    parallel layout, or NCCL's tuner picking a tree over a ring): from then on the ports wait half
    to twice as long to send and the collectives take 8 % less to 8 % more, steady at the new
    level; nothing is dropped or counted."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    after = (t >= rng.integers(10, STEPS - 10, (n, 1))).astype(float)
    port_waits_longer(w, 1 + after * (2 ** rng.uniform(-1, 1, (n, 1)) - 1))
    change = w.comm_ms * after * rng.uniform(-0.08, 0.08, (n, 1))
    w.comm_ms = w.comm_ms + change
    w.step_ms = w.step_ms + change
    return w


# --- communication -----------------------------------------------------------------------------


def mtu_mismatch_fragmentation(rng, hw, n):
    """A switch configuration push at the onset leaves the path MTU smaller than the NIC's: messages
    are split and some resent, the collectives take 30-80 % longer, the ports wait 1.5-2.5 times as
    long to send, and a steady trickle of drops (a fraction of one to a few a second) is counted."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 3, n))
    port_waits_longer(w, 1 + on * (0.3 + 1.2 * s))
    counter_rate(w, "rdma_qps_dropped_per_second", 0.2 + 2.8 * s, on)
    collectives_slower(w, w.comm_ms * on * (0.2 + 0.6 * s))
    return w


def nic_thermal_throttle_spells(rng, hw, n):
    """The NIC overheats (its temperature is not among the features) and from the onset throttles
    its link in spells (some 40 s on average, as short as 5 s, about a minute apart): in a spell the
    ports wait 4-10 times as long to send and the collectives take 70-200 % longer; a few symbol
    errors are counted as a spell begins."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    spell = burst_steps(w, on=8, off=14) * w.after()
    begins = np.clip(spell - np.roll(spell, 1, axis=1), 0, 1)
    port_waits_longer(w, 1 + spell * (2 + 7 * s))
    counter_rate(w, "ib_symbol_errors_per_second", 0.4 + 1.6 * s, begins)
    collectives_slower(w, w.comm_ms * spell * (0.5 + 1.5 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def swap_onto_local_nvme(rng, hw, n):
    """Host memory runs short from the onset and the data loader's pages swap to the local NVMe:
    the drive warms by 3-8 C, the input waits grow long-tailed (some 3-11 times their usual median,
    some samples far more) and each step takes that much longer."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(3, 12, n))
    disk_warmer(w, on, 3 + 5 * s)
    tail = rng.lognormal(0, 0.8, (n, STEPS))
    input_slower(w, on * w.data_ms * (1 + 9 * s) * tail)
    return w


def parallel_fs_client_eviction(rng, hw, n):
    """The parallel file system evicts the node's client at the onset: for 30-90 s each step waits
    four to ten times its usual step time for its input (the GPUs mostly idle; a real eviction may
    block longer), then the client reconnects with a cold cache and the input waits stay 40-100 %
    longer than before for the rest of the window (a small share of the step)."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 15, 90)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    stall_len = rng.integers(6, 19, (n, 1))
    stall = (t >= w.onset[:, None]) & (t < w.onset[:, None] + stall_len)
    after = t >= w.onset[:, None] + stall_len
    extra = stall * w.step_ms * (3 + 7 * s) + after * w.data_ms * (0.3 + 0.7 * s)
    input_slower(w, extra)
    return w


# --- compute -----------------------------------------------------------------------------------


def host_cpu_prochot(rng, hw, n):
    """The host CPUs are throttled from the onset (a PROCHOT from a failing board regulator): the
    kernels launch late, every step takes 26-60 % longer, the GPUs wait for the host between kernels
    (utilisation and power fall with the step, their clocks hold); the collectives and the input
    take as long as before."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 6, n))
    step_slower(w, w.step_ms * on * (0.2 + 0.4 * s))
    return w


def one_gpu_clock_flapping(rng, hw, n):
    """One board's power-brake signal flaps from the onset: about every 40 s its GPU drops to 55-76 %
    of its clock for some 15 s and comes back; its power follows and every step in those
    samples waits for it."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s = severity_of(w)
    gpu = some_gpus(w, 1, 1)
    braked = burst_steps(w, on=3, off=5) * w.after()
    gpus_slower(w, gpu, 1 - braked * (0.2 + 0.25 * s))
    return w


SET12: dict[str, tuple[str, Family]] = {
    "healthy.fp8_switch_faster": ("healthy", healthy_fp8_switch_faster),
    "healthy.uneven_pipeline_stages": ("healthy", healthy_uneven_pipeline_stages),
    "healthy.nccl_algorithm_switch": ("healthy", healthy_nccl_algorithm_switch),
    "communication.mtu_mismatch_fragmentation": ("communication", mtu_mismatch_fragmentation),
    "communication.nic_thermal_throttle_spells": ("communication", nic_thermal_throttle_spells),
    "storage.swap_onto_local_nvme": ("storage", swap_onto_local_nvme),
    "storage.parallel_fs_client_eviction": ("storage", parallel_fs_client_eviction),
    "compute.host_cpu_prochot": ("compute", host_cpu_prochot),
    "compute.one_gpu_clock_flapping": ("compute", one_gpu_clock_flapping),
}
