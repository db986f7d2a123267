"""Healthy work in combinations (since generator version 7). Each fresh set so far found a healthy
workload the model read as a fault, and each had one benign change at a time in training: a
swing in load, a change of pace, a stall now and then. Real nodes combine them (a job that
checkpoints while its load swings, a profiler on a job that just changed phase), so this family
draws two to four of the benign changes the training families already show, each with its own
timing and size, and applies them to one healthy window. Each change is a training family's own,
rewritten here as a change of a window (some with a narrower or wider range than the family's);
none is new. So what tells a fault is what the fault costs the job, not the absence of anything
else moving."""

from __future__ import annotations

import dataclasses

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import (
    F,
    Family,
    Window,
    busy_pattern,
    disk_warmer,
    healthy_window,
    input_slower,
    step_slower,
)
from stethoscope_training.families_healthy_variety import load_following

ARRAYS = ("temp", "power", "clock", "util", "node", "job", "step_ms", "comm_ms", "data_ms")


def _stretch(rng, n: int, low: int, high: int) -> np.ndarray:
    """[n, T] True over one stretch of low..high steps at a random start."""
    t = np.arange(STEPS)[None, :]
    start = rng.integers(0, STEPS - low, (n, 1))
    return (t >= start) & (t < start + rng.integers(low, high + 1, (n, 1)))


def load_swings(w: Window) -> None:
    """The GPU load wanders or swings periodically; the pace holds (load_wander, periodic_load)."""
    rng, n = w.rng, w.n
    t = np.arange(STEPS)[None, :]
    walk = np.clip(
        rng.uniform(0.6, 1.0, (n, 1)) + np.cumsum(rng.normal(0, 0.04, (n, STEPS)), axis=1), 0.45, 1
    )
    wave = 1 - rng.uniform(0.1, 0.5, (n, 1)) * (
        0.5 + 0.5 * np.sin(2 * np.pi * t / rng.uniform(2, 12, (n, 1)))
    )
    load_following(w, np.where(rng.random((n, 1)) < 0.5, walk, wave))


def pace_change(w: Window) -> None:
    """From a step on, or for a stretch, each step takes another time, its collectives and input in
    proportion or not quite (phase_change, eval_phase, job_restart's new job)."""
    rng, n = w.rng, w.n
    phase = np.where(
        rng.random((n, 1)) < 0.5,
        _stretch(rng, n, 8, 60),
        np.arange(STEPS)[None, :] >= rng.integers(5, STEPS - 10, (n, 1)),
    )
    factor = np.where(
        rng.random((n, 1)) < 0.5, rng.uniform(0.3, 0.85, (n, 1)), rng.uniform(1.15, 2.0, (n, 1))
    )
    w.step_ms = np.where(phase, w.step_ms * factor, w.step_ms)
    w.comm_ms = np.where(phase, w.comm_ms * factor * rng.uniform(0.5, 1.5, (n, 1)), w.comm_ms)
    w.data_ms = np.where(phase, w.data_ms * factor * rng.uniform(0.5, 2.0, (n, 1)), w.data_ms)


def routine_stalls(w: Window) -> None:
    """Checkpoint saves every 15-40 steps: a short stall, the input behind the writes, the drive
    warming while it writes (checkpoint_saves)."""
    rng, n = w.rng, w.n
    t = np.arange(STEPS)[None, :]
    saving = (t + rng.integers(0, 40, (n, 1))) % rng.integers(15, 41, (n, 1)) < rng.integers(1, 4, (n, 1))
    stall = w.step_ms * saving * rng.uniform(0.3, 1.5, (n, 1))
    w.data_ms = w.data_ms + 0.5 * stall
    step_slower(w, stall)
    disk_warmer(w, saving.astype(float), rng.uniform(1, 4, (n, 1)))


def one_stall(w: Window) -> None:
    """One stall of 1-6 samples: waiting for input (an epoch boundary) or for the host (a pause of
    the job's own), the GPUs idle meanwhile (epoch_boundary, job_transition's warm-up)."""
    rng, n = w.rng, w.n
    stall = _stretch(rng, n, 1, 6) * w.step_ms * rng.uniform(0.5, 5, (n, 1))
    on_input = rng.random((n, 1)) < 0.5
    input_slower(w, stall * on_input)
    step_slower(w, stall * ~on_input)


def host_stretch(w: Window) -> None:
    """For half a minute to two minutes each step takes 10-40 % longer for nothing the node's parts
    show (a profiler, the host busy with something else): profiler_stretch."""
    rng, n = w.rng, w.n
    step_slower(w, w.step_ms * _stretch(rng, n, 6, 24) * rng.uniform(0.1, 0.4, (n, 1)))


def job_gap(w: Window) -> None:
    """The job restarts: 15 s to a minute and a quarter without a job, GPUs idle (job_restart)."""
    rng, n = w.rng, w.n
    gap = _stretch(rng, n, 3, 15)
    hw = w.hw
    w.util = np.where(gap[:, :, None], 0.0, w.util)
    w.power = np.where(gap[:, :, None], hw.idle_power * rng.uniform(1.0, 1.2, (n, 1, 1)), w.power)
    w.clock = np.where(gap[:, :, None], hw.idle_clock, w.clock)
    w.job = w.job & ~gap


def warmer_room(w: Window) -> None:
    """The node sits warmer, or the room's cooling cycles (hot_aisle, room_temperature_cycle)."""
    rng, n = w.rng, w.n
    t = np.arange(STEPS)[None, :]
    swing = rng.uniform(2, 5, (n, 1)) * np.sin(
        2 * np.pi * t / rng.uniform(96, 360, (n, 1)) + rng.uniform(0, 6.3, (n, 1))
    )
    offset = np.where(rng.random((n, 1)) < 0.5, rng.uniform(5, 10, (n, 1)), swing)
    w.temp = np.rint(w.temp + offset[:, :, None])
    disk = F["disk_temperature_celsius"]
    w.node[:, :, disk] = np.rint(w.node[:, :, disk] + offset * 0.5)


def uneven_steps(w: Window) -> None:
    """Every step takes its own time, the collectives with it (variable_sequences)."""
    rng, n = w.rng, w.n
    spread = rng.lognormal(0, rng.uniform(0.15, 0.35, (n, 1)), (n, STEPS))
    spread = spread / np.median(spread, axis=1, keepdims=True)
    w.step_ms = w.step_ms * spread
    w.comm_ms = w.comm_ms * (0.5 + 0.5 * spread)


CHANGES = (
    load_swings,
    pace_change,
    routine_stalls,
    one_stall,
    host_stretch,
    job_gap,
    warmer_room,
    uneven_steps,
)


def healthy_composed(rng, hw, n):
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    count = rng.integers(2, 5, n)
    order = np.argsort(rng.random((n, len(CHANGES))), axis=1)
    for k, change in enumerate(CHANGES):
        chosen = np.flatnonzero(order[:, k] < count)  # a random `count` of the changes per episode
        if not len(chosen):
            continue
        part = _subset(w, chosen)
        change(part)
        for name in ARRAYS:
            getattr(w, name)[chosen] = getattr(part, name)
    return w


def _subset(w: Window, rows: np.ndarray) -> Window:
    """The chosen episodes of a window, as a window of their own (copies)."""
    sliced = {
        f.name: (
            getattr(w, f.name)[rows].copy()
            if isinstance(getattr(w, f.name), np.ndarray)
            else getattr(w, f.name)
        )
        for f in dataclasses.fields(w)
    }
    return Window(**{**sliced, "n": len(rows)})


COMPOSED: dict[str, tuple[str, Family]] = {"healthy.composed": ("healthy", healthy_composed)}
