# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for perftest output (ib_write_lat, ib_read_lat, ib_write_bw, ib_read_bw, ...)."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
)

TOOL = "perftest"
LAT_COLUMNS = (
    "bytes",
    "iterations",
    "t_min_us",
    "t_max_us",
    "t_typical_us",
    "t_avg_us",
    "t_stdev_us",
    "p99_us",
    "p999_us",
)
BW_COLUMNS = ("bytes", "iterations", "bw_peak", "bw_average", "msg_rate_mpps")
FAILURE_MARKERS = (
    "Failed status",
    "Completion with error",
    "Failed to complete",
    "Couldn't connect",
    "Unable to init the socket connection",
    "Failed to modify QP",
    "Couldn't allocate",
)
# perftest's MB is 2^20 bytes (its "MB/sec" without --report_gbits); Gb/sec is 10^9 bits.
MB_PER_SEC_TO_GBIT = 1048576 * 8 / 1e9
# perftest closes every result table with a line of dashes; a run stopped by ^C or killed ends without it.
CLOSING_LINE = "-" * 20


def _incomplete_failure(open_tables, last_number, last_line):
    if not open_tables:
        return None
    return (
        "incomplete: the output ends at line %d inside the result table, without its closing line "
        "(the run was interrupted or killed): %r" % (last_number, last_line.strip()[:80])
    )


def parse_perftest(text):
    """-> {"kind": "lat"|"bw", "rows": [...], "bw_unit", "incomplete", "failed", "failure"}; bandwidth rows
    also carry "bw_average_gbit_per_s". Interleaved warnings ("Conflicting CPU frequency") are skipped.
    `incomplete` (and so `failed`) when a result table lacks its closing line: the rows read so far are
    what an interrupted run measured, never a complete result."""
    kind, unit, rows, failure = None, None, [], None
    open_tables, last_number, last_line = 0, 0, ""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        last_number, last_line = number, line
        if failure is None and any(marker in stripped for marker in FAILURE_MARKERS):
            failure = stripped
        if stripped.startswith(CLOSING_LINE):
            open_tables = max(0, open_tables - 1)
            continue
        if stripped.startswith("#bytes"):
            open_tables += 1
            if "t_typical" in stripped:
                kind = "lat"
            elif "BW average" in stripped:
                kind = "bw"
                unit = "Gb/sec" if "Gb/sec" in stripped else "MB/sec"
            else:
                raise ParseError(TOOL, "unknown result header", number, line)
            continue
        if kind is None or not stripped[0].isdigit():
            continue
        fields = stripped.split()
        columns = LAT_COLUMNS if kind == "lat" else BW_COLUMNS
        if len(fields) != len(columns):
            if "[" in stripped or len(fields) < 2:
                continue  # a stray numbered line (e.g. "scnt=128") is not a result
            raise ParseError(
                TOOL, "%d fields, the %s header has %d" % (len(fields), kind, len(columns)), number, line
            )
        try:
            row = {name: float(value) for name, value in zip(columns, fields)}
        except ValueError:
            raise ParseError(TOOL, "a result field is not a number", number, line) from None
        if kind == "bw":
            factor = 1.0 if unit == "Gb/sec" else MB_PER_SEC_TO_GBIT
            row["bw_average_gbit_per_s"] = row["bw_average"] * factor
            row["bw_peak_gbit_per_s"] = row["bw_peak"] * factor
        rows.append(row)
    if kind is None and failure is None:
        line_no, line = first_nonblank(text)
        raise ParseError(TOOL, "no '#bytes' result header and no recognised failure", line_no, line)
    incomplete = _incomplete_failure(open_tables, last_number, last_line)
    failure = failure or incomplete
    return {
        "kind": kind,
        "bw_unit": unit,
        "rows": rows,
        "incomplete": incomplete is not None,
        "failed": failure is not None,
        "failure": failure,
    }
