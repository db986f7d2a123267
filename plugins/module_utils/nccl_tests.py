# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for nccl-tests output (all_reduce_perf, all_gather_perf, ...)."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
)

TOOL = "nccl-tests"
# Launch failures (MPI, NCCL) that leave no result table, and the line that says what happened.
FAILURE_MARKERS = (
    "There are not enough slots available",
    "mpirun noticed that process",
    "MPI_ABORT was invoked",
    "NCCL WARN",
    "Test NCCL failure",
    "Test CUDA failure",
    "ORTE was unable to",
    "mpirun was unable to",
)


def _number(raw, number, line):
    if raw == "N/A":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ParseError(TOOL, "value %r is not a number" % raw, number, line) from None


def parse_nccl_tests(text):
    """-> {"rows": [...], "avg_busbw_gb_per_s", "wrong", "nccl_version", "failed", "failure"}.

    A row: size (bytes), count, type, redop, and per placement (oop = out-of-place, ip = in-place)
    time_us, algbw and busbw (GB/s) and wrong (None where the test did not validate)."""
    rows, failure, version, average = [], None, None, None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if failure is None:
            for marker in FAILURE_MARKERS:
                if marker in stripped:
                    failure = stripped
        match = re.match(r"NCCL version (\S+)", stripped)
        if match:
            version = match.group(1)
            continue
        match = re.match(r"# Avg bus bandwidth\s*:\s*(\S+)", stripped)
        if match:
            average = _number(match.group(1), number, line)
            continue
        if not re.match(r"\d+\s+\d+\s+\S+\s", stripped):
            continue  # prose, banners, NCCL INFO lines (MPI's "1. Hostfile, ..." too)
        fields = stripped.split()
        if len(fields) not in (11, 12, 13):  # older versions print no root, all_gather no redop
            raise ParseError(
                TOOL, "a result line has %d fields, expected 11 to 13" % len(fields), number, line
            )
        size, count = int(_number(fields[0], number, line)), int(_number(fields[1], number, line))
        values = [_number(raw, number, line) for raw in fields[-8:]]
        rows.append(
            {
                "size": size,
                "count": count,
                "type": fields[2],
                "redop": fields[3] if len(fields) > 11 else "none",
                "oop_time_us": values[0],
                "oop_algbw": values[1],
                "oop_busbw": values[2],
                "oop_wrong": values[3],
                "ip_time_us": values[4],
                "ip_algbw": values[5],
                "ip_busbw": values[6],
                "ip_wrong": values[7],
            }
        )
    if not rows and failure is None:
        line_no, line = first_nonblank(text)
        raise ParseError(TOOL, "no result table and no recognised failure", line_no, line)
    wrong = sum(int(row[key] or 0) for row in rows for key in ("oop_wrong", "ip_wrong"))
    return {
        "rows": rows,
        "avg_busbw_gb_per_s": average,
        "wrong": wrong,
        "nccl_version": version,
        "failed": failure is not None and not rows,
        "failure": failure,
    }
