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


def timed_side_by_side(
    repeat: int, call: Callable[[], object], reference: Callable[[], object]
) -> tuple[dict, dict]:
    """`timed` of `call` and of `reference`, their calls alternating after one untimed call of each, so
    that a cold cache or a busy minute favours neither."""
    call(), reference()
    timings: tuple[list[dict], list[dict]] = ([], [])
    for _ in range(repeat):
        for calls, one in zip(timings, (call, reference), strict=True):
            calls.append(timed(1, one))

    def merged(runs: list[dict]) -> dict:
        wall = [run["seconds"][0] for run in runs]
        cpu = [run["median_cpu_seconds"] for run in runs]
        return {
            "seconds": wall,
            "median_seconds": round(stats.median(wall), 3),
            "median_cpu_seconds": round(stats.median(cpu), 3),
        }

    return merged(timings[0]), merged(timings[1])
