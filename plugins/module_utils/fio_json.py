# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for `fio --output-format=json`."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    expect,
    first_nonblank,
    load_json,
)

TOOL = "fio --output-format=json"
PERCENTILES = {"p50": "50.000000", "p99": "99.000000", "p99_9": "99.900000"}


def _latency_us(direction):
    """Completion-latency percentiles in µs, and which fio block they came from.

    clat_ns is fio 3's default; with lat_percentiles=1 they sit in lat_ns; fio 2 reports clat in µs.
    None where fio measured none (gtod_reduce=1 reports zeros)."""
    found = [
        (block, divisor)
        for block, divisor in (("clat_ns", 1000.0), ("lat_ns", 1000.0), ("clat", 1.0))
        if isinstance(direction.get(block), dict) and direction[block].get("percentile")
    ]
    if not found:
        return {name: None for name in PERCENTILES}, None, None
    block, scale = found[0]
    stats = direction[block]
    percentiles = stats["percentile"]
    values = {}
    for name, key in PERCENTILES.items():
        value = percentiles.get(key)
        values[name] = value / scale if isinstance(value, (int, float)) and value > 0 else None
    mean = stats.get("mean")
    return values, (mean / scale if isinstance(mean, (int, float)) and mean > 0 else None), block


def parse_fio_json(text):
    """-> {"fio_version", "jobs": [{"name", "read"/"write": {"iops", "bw_kib_s", "clat_us", ...}}]}.

    fio may print notes before its JSON; they are skipped."""
    start = (text or "").find("{")
    if start < 0:
        line_no, line = first_nonblank(text or "")
        raise ParseError(TOOL, "no JSON object in output", line_no, line)
    data = expect(TOOL, load_json(TOOL, text[start:]), dict, "fio output")
    jobs = []
    for job in expect(TOOL, data.get("jobs"), list, "jobs"):
        job = expect(TOOL, job, dict, "job")
        entry = {"name": job.get("jobname"), "error": job.get("error", 0)}
        for direction in ("read", "write"):
            stats = job.get(direction)
            if not isinstance(stats, dict) or not stats.get("io_bytes"):
                continue
            latency, mean, source = _latency_us(stats)
            entry[direction] = {
                "iops": float(stats.get("iops", 0)),
                "bw_kib_s": float(stats.get("bw", 0)),
                "clat_us": latency,
                "clat_mean_us": mean,
                "latency_source": source,
            }
        jobs.append(entry)
    return {"fio_version": data.get("fio version"), "jobs": jobs}
