# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for fio latency logs (`--write_lat_log`, `--log_avg_msec`) and the cliff detector."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

TOOL = "fio latency log"


def parse_lat_log(text):
    """'time_ms, value_ns, direction, block_size, offset[, prio]' lines -> [(seconds, latency_us)]."""
    points = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 4:
            raise ParseError(TOOL, "expected 'time, value, direction, bs[, offset]'", number, line)
        try:
            points.append((int(fields[0]) / 1000.0, int(fields[1]) / 1000.0))
        except ValueError:
            raise ParseError(TOOL, "time or value is not an integer", number, line) from None
    return points


def latency_jump(points, factor=10.0, baseline_seconds=60.0, hold_points=3):
    """The first time latency stays above `factor` x the baseline (median of the first
    `baseline_seconds`) for `hold_points` samples in a row: the seed's 120 µs -> 8 ms cliff."""
    if len(points) < hold_points + 1:
        return None
    start = points[0][0]
    early = sorted(value for at, value in points if at - start <= baseline_seconds) or [points[0][1]]
    baseline = early[len(early) // 2]
    run = 0
    for index, (_at, value) in enumerate(points):
        run = run + 1 if value > factor * baseline else 0
        if run == hold_points:
            first_at, first_value = points[index - hold_points + 1]
            return {
                "at_seconds": first_at - start,
                "baseline_us": baseline,
                "after_us": first_value,
                "factor": first_value / baseline if baseline else None,
            }
    return None
