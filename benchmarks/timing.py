"""Median wall and CPU seconds of repeated calls, as the benchmarks that time work in this process
report them (chdb runs in the process: its threads' CPU counts)."""

from __future__ import annotations

import time
from collections.abc import Callable

from stethoscope import stats


def timed(repeat: int, call: Callable[[], object]) -> dict:
    """Each call's wall seconds, and the median wall and CPU seconds of `repeat` calls."""
    wall, cpu = [], []
    for _ in range(repeat):
        started, used = time.perf_counter(), time.process_time()
        call()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return {
        "seconds": [round(w, 3) for w in wall],
        "median_seconds": round(stats.median(wall), 3),
        "median_cpu_seconds": round(stats.median(cpu), 3),
    }
