"""The thirteenth clean hold-out's nine families (fresh set 13). They were written before the model of
generator version 12 was trained and scored it once (macro-F1 0.765, 21.67 % of healthy episodes
with a finding, all of them the mixture-of-experts job's, read as communication 130 times of 200;
GPUDirect RDMA lost at a restart found 20 %; the host DIMM's correctable-error storm read as compute
28 %; benchmarks/results/model_fresh_history.json). Version 11 scored 0.728 / 25.5 % on it for
comparison (benchmarks/results/model_fresh_set13_by_version11.json). Since generator version 13 they
are training families (stethoscope_training.episodes.FAMILIES); stethoscope_training.fresh holds the
current hold-out."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    F,
    Family,
    burst_steps,
    busy_pattern,
    collectives_slower,
    fault_onsets,
    healthy_window,
    input_slower,
    others_wait,
    port_waits_longer,
    severity_of,
    some_gpus,
    step_slower,
)

# --- healthy -----------------------------------------------------------------------------------


def healthy_moe_all_to_all_variance(rng, hw, n):
    """A mixture-of-experts job: how many tokens each rank's experts receive changes from step to
    step, so its all-to-all collectives take from about half to twice their median (lognormal, a
    spread of 0.25-0.5 from episode to episode), the ports wait to send in proportion, and the step
    follows; the GPUs idle in the longer exchanges. The same all window long; nothing is wrong."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    factor = np.exp(rng.normal(0, 1, (n, STEPS)) * rng.uniform(0.25, 0.5, (n, 1)))
    change = w.comm_ms * (factor - 1)
    port_waits_longer(w, factor)
    collectives_slower(w, np.maximum(change, 0))
    shorter = np.minimum(change, 0)
    w.comm_ms = w.comm_ms + shorter
    w.step_ms = w.step_ms + shorter
    return w


def healthy_tensor_parallel_over_nvlink(rng, hw, n):
    """A tensor-parallel job kept inside the node: its collectives run over NVLink and take 30-50 %
    of every step, while the IB ports carry only the small data-parallel reduction and wait a tenth
    to a third as long as a typical job's; the GPUs stay busy through the collectives (NCCL's
    kernels run on them) and the step keeps its pace. The same all window long."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    share = rng.uniform(0.3, 0.5, (n, 1))
    w.comm_ms = w.comm_ms * share / np.median(w.comm_ms / w.step_ms, axis=1, keepdims=True)
    port_waits_longer(w, rng.uniform(0.1, 0.33, (n, 1)))
    return w


def healthy_liquid_cooled_node(rng, hw, n):
    """A direct-liquid-cooled node: under load its GPUs run 12-20 C cooler than the air-cooled
    capture's, and at the same power cap the cooler silicon holds one to four 15-MHz clock steps
    more; its drives sit 5-10 C cooler too. The same all window long; nothing is wrong."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    w.temp = np.rint(w.temp - rng.uniform(12, 20, (n, 1, 1)))
    w.clock = np.minimum(w.clock + hw.clock_step * rng.integers(1, 5, (n, 1, 1)), hw.max_clock)
    disk = F["disk_temperature_celsius"]
    w.node[:, :, disk] = w.node[:, :, disk] - np.rint(rng.uniform(5, 10, (n, 1)))
    return w


# --- communication -----------------------------------------------------------------------------


def gpudirect_rdma_lost_after_restart(rng, hw, n):
    """The job restarts inside the window (its GPUs idle for 10-30 s) on a node whose peer-memory
    module did not load after a driver update: without GPUDirect RDMA its collectives bounce through
    host memory and take 52-120 % longer from then on, while the ports, fed more slowly, wait half to
    three quarters as long to send; nothing is dropped or counted."""
    t = np.arange(STEPS)[None, :]
    end = rng.integers(15, STEPS - 30, (n, 1))
    start = end + rng.integers(2, 7, (n, 1))
    w = healthy_window(rng, hw, n, ((t < end) | (t >= start)).astype(float))
    w.onset, w.severity = start[:, 0], rng.uniform(0.15, 1.0, n)
    s, after = severity_of(w), (t >= start).astype(float)
    port_waits_longer(w, 1 - after * (0.2 + 0.3 * s))
    collectives_slower(w, w.comm_ms * after * (0.4 + 0.8 * s))
    return w


def ecmp_hash_collision(rng, hw, n):
    """A routing change at the onset hashes this node's flows onto the same spine uplink as another
    job's: from then on its collectives alternate with the flows' hash, in runs of a few samples,
    some as fast as before and some (about four in ten) 81-200 % slower with the ports waiting 4-12
    times as long to send; nothing is dropped."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    s = severity_of(w)
    collide = burst_steps(w, on=3, off=4) * w.after()
    port_waits_longer(w, 1 + collide * (3 + 8 * s))
    collectives_slower(w, w.comm_ms * collide * (0.6 + 1.4 * s))
    return w


# --- storage -----------------------------------------------------------------------------------


def degraded_shard_server(rng, hw, n):
    """One of the storage servers holding the job's dataset shards degrades at the onset (a failing
    disk in its pool): the samples whose shard lives there, every third to sixth in the loader's
    fixed order, wait 4-10 times their usual input time plus a third of a step to a whole step; the
    other samples and the local drive are as before."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 90)
    s = severity_of(w)
    t = np.arange(STEPS)[None, :]
    period = rng.integers(3, 7, (n, 1))
    hit = (t % period == rng.integers(0, 6, (n, 1)) % period) & (t >= w.onset[:, None])
    input_slower(w, hit * (w.data_ms * (2 + 7 * s) + w.step_ms * (0.2 + 0.8 * s)))
    return w


def lock_recovery_backoff(rng, hw, n):
    """The file system's metadata server restarts at the onset and the client's lock recovery
    retries with exponential backoff: stalls of some 1, 2, 4, 8 s and on (from three quarters of a
    second to two at first, as it gets worse; at most 30 s), 30-60 s apart, each adding to one
    sample's input wait and step while the GPUs idle; between the stalls everything is as before."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 70)
    extra = np.zeros((n, STEPS))
    gaps = rng.integers(6, 13, n)
    for i in range(n):
        stall, at = 500 + 1500 * w.severity[i], int(w.onset[i])
        while at < STEPS:
            extra[i, at] = stall
            stall, at = min(2 * stall, 30_000), at + int(gaps[i])
    input_slower(w, extra)
    return w


# --- compute -----------------------------------------------------------------------------------


def host_memory_ce_storm(rng, hw, n):
    """A host DIMM starts reporting correctable errors at the onset and the firmware's handling of
    them (interrupt storms, SMIs) stalls the CPUs in spells of some 35 s on average (as short as 5 s)
    every minute or two: in a spell every step takes 20-50 % longer and the GPUs wait for the host
    between kernels (utilisation and power fall with the step, clocks hold); the collectives and the
    input take as long as before, and between spells nothing shows."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")), 10, 80)
    spell = burst_steps(w, on=7, off=16) * w.after()
    step_slower(w, w.step_ms * spell * (0.15 + 0.35 * severity_of(w)))
    return w


def gpu_memory_clock_stuck_low(rng, hw, n):
    """One GPU's memory clock drops to its lowest state at the onset and stays there (a driver fault
    that only a reset clears): its kernels starve for memory bandwidth, so it draws 35-56 % of the
    cap, runs 7-14 C cooler and, with power to spare, boosts its SM clock to the maximum, all while
    fully busy; every step takes 1.6-3 times as long and the other GPUs wait for it in the
    collectives."""
    w = fault_onsets(healthy_window(rng, hw, n, busy_pattern(rng, n, "load")))
    s, on = severity_of(w), w.after(rng.integers(1, 4, n))
    gpu, o, sg = some_gpus(w, 1, 1)[:, None, :], on[:, :, None], s[:, :, None]
    starved = hw.cap_power * (0.6 - 0.25 * sg) * (1 + rng.normal(0, 0.01, w.power.shape))
    w.power = np.where(gpu, w.power + o * (starved - w.power), w.power)
    w.temp = np.where(gpu, np.rint(w.temp - o * (6 + 8 * sg)), w.temp)
    boosted = hw.clock_step * np.rint((w.clock + o * (hw.max_clock - w.clock)) / hw.clock_step)
    w.clock = np.where(gpu, boosted, w.clock)
    others_wait(w, gpu, w.step_ms * on * (0.4 + 1.6 * s))
    return w


SET13: dict[str, tuple[str, Family]] = {
    "healthy.moe_all_to_all_variance": ("healthy", healthy_moe_all_to_all_variance),
    "healthy.tensor_parallel_over_nvlink": ("healthy", healthy_tensor_parallel_over_nvlink),
    "healthy.liquid_cooled_node": ("healthy", healthy_liquid_cooled_node),
    "communication.gpudirect_rdma_lost_after_restart": ("communication", gpudirect_rdma_lost_after_restart),
    "communication.ecmp_hash_collision": ("communication", ecmp_hash_collision),
    "storage.degraded_shard_server": ("storage", degraded_shard_server),
    "storage.lock_recovery_backoff": ("storage", lock_recovery_backoff),
    "compute.host_memory_ce_storm": ("compute", host_memory_ce_storm),
    "compute.gpu_memory_clock_stuck_low": ("compute", gpu_memory_clock_stuck_low),
}
