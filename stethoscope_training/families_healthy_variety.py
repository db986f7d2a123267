"""Healthy variety (since generator version 3): what a healthy node's signals may do that no fault family
needs. Fresh set 2 showed healthy workloads whose GPU load swings (pipeline bubbles) or whose step
changes pace (an evaluation pass) read as faults: the training families had every healthy window
steady, so any change meant a fault. These families move the GPU signals, or the job's pace, the way
healthy work does, with nothing getting slower for want of a part: a fault costs the job time or
shows an error, a temperature or a clock out of step with the load."""

from __future__ import annotations

import numpy as np

from stethoscope.model.metadata import STEPS
from stethoscope_training.families import Family, busy_pattern, healthy_window


def load_following(w, level: np.ndarray) -> None:
    """GPU utilisation, power, clock and temperature following a load level [n, T] in 0..1 while
    the job's pace stays (the work per step is the same; the GPUs are idle in between)."""
    hw, lv = w.hw, level[:, :, None]
    w.util = np.clip(np.rint(w.util * lv), 0, 100)
    w.power = hw.idle_power + (w.power - hw.idle_power) * (0.15 + 0.85 * lv)
    headroom = (1 - lv) * (hw.max_clock - hw.load_clock) * w.rng.uniform(0.2, 1.0, (w.n, 1, 1))
    w.clock = np.minimum(hw.clock_step * np.rint((w.clock + headroom) / hw.clock_step), hw.max_clock)
    w.temp = np.rint(hw.idle_temp + (w.temp - hw.idle_temp) * (0.4 + 0.6 * lv))


def healthy_load_wander(rng, hw, n):
    """A job whose GPU load wanders (memory-bound phases, uneven micro-batches): utilisation and
    power drift between about half and full, now and then a level change; the step time holds."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    walk = np.cumsum(rng.normal(0, 0.04, (n, STEPS)), axis=1)
    t = np.arange(STEPS)[None, :]
    shift = np.where(t >= rng.integers(0, STEPS, (n, 1)), rng.uniform(-0.3, 0.3, (n, 1)), 0.0)
    level = np.clip(rng.uniform(0.6, 1.0, (n, 1)) + walk + shift, 0.45, 1.0)
    load_following(w, level)
    return w


def healthy_periodic_load(rng, hw, n):
    """A job with a periodic load (gradient accumulation, pipeline stages, an interleaved data
    phase): the GPU signals swing with a period of 2-12 samples at their own depth; pace steady."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    period = rng.uniform(2.0, 12.0, (n, 1))
    depth = rng.uniform(0.1, 0.5, (n, 1))
    wave = 0.5 + 0.5 * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi, (n, 1)))
    square = rng.random((n, 1)) < 0.4  # a schedule that switches rather than swings
    wave = np.where(square, (wave > 0.5).astype(float), wave)
    load_following(w, 1 - depth * wave)
    return w


def healthy_phase_change(rng, hw, n):
    """The job changes phase inside the window (an evaluation pass, another sequence length or
    curriculum stage, a smaller model stage): from a step on, or for a stretch, each step takes a
    different time (shorter or longer), its collectives and input in proportion; the GPUs stay as
    busy, or idle in the shorter forward-only steps' gaps."""
    w = healthy_window(rng, hw, n, busy_pattern(rng, n, "load"))
    t = np.arange(STEPS)[None, :]
    start = rng.integers(5, STEPS - 10, (n, 1))
    stretch = np.where(rng.random((n, 1)) < 0.5, rng.integers(8, 40, (n, 1)), STEPS)
    phase = (t >= start) & (t < start + stretch)
    factor = np.where(
        rng.random((n, 1)) < 0.6, rng.uniform(0.25, 0.8, (n, 1)), rng.uniform(1.15, 1.8, (n, 1))
    )
    comm = factor * rng.uniform(0.3, 1.2, (n, 1))
    data = rng.uniform(0.8, 2.5, (n, 1))
    w.step_ms = np.where(phase, w.step_ms * factor, w.step_ms)
    w.comm_ms = np.where(phase, w.comm_ms * comm, w.comm_ms)
    w.data_ms = np.where(phase, w.data_ms * data, w.data_ms)
    lighter = np.where(factor < 1, rng.uniform(0.8, 1.0, (n, 1)), 1.0)
    load_following(w, np.where(phase, lighter, 1.0))
    return w


HEALTHY_VARIETY: dict[str, tuple[str, Family]] = {
    "healthy.load_wander": ("healthy", healthy_load_wander),
    "healthy.periodic_load": ("healthy", healthy_periodic_load),
    "healthy.phase_change": ("healthy", healthy_phase_change),
}
