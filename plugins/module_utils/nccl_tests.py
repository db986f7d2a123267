# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for nccl-tests output (all_reduce_perf, all_gather_perf, ...).

Reads every format nccl-tests has printed: the 2017 one (times in ms, a `res` column, a summary without
`#`), the pre-2.13 one (an `error` column holding the largest deviation) and today's (`#wrong` counts,
`N/A` where results were not checked), also behind launcher prefixes (mpirun --tag-output, srun --label)."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
)

TOOL = "nccl-tests"
# Lines after which nccl-tests or its launcher gave up: the run is a failure even with part of a table.
FATAL_MARKERS = (
    "There are not enough slots available",
    "mpirun noticed that process",
    "MPI_ABORT was invoked",
    "Test NCCL failure",
    "Test CUDA failure",
    "ORTE was unable to",
    "mpirun was unable to",
)
# NCCL warns and carries on ("Could not find a path for pattern 4"): a failure only when no table follows.
WARNING_MARKERS = ("NCCL WARN",)
# mpirun --tag-output "[1,0]<stdout>:", srun --label " 0: " (the rank right-aligned to the widest rank).
LAUNCHER_PREFIX = re.compile(r"^(?:\[\d+,(?P<mpi_rank>\d+)\]<std(?:out|err)>:|\s*(?P<srun_rank>\d+): ?)")
RESULT_ROW = re.compile(r"\d+\s+\d+\s+\S+\s")
SUMMARY = re.compile(r"#?\s*(Avg bus bandwidth|Out of bounds values)\s*:\s*(\S+)\s*(OK|FAILED)?")
# "#  Rank  8 Group  0 Pid 739786 on     h100-4 device  0 [...]" (before 2.13 without "Group")
RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
# NCCL's own INFO line of a communicator ("comm 0x55ba... rank 0 nranks 1 cudaDev 0 ... - Destroy COMPLETE"):
# its size, where the output lists no devices (a binary built without MPI, started 16 times by mpirun)
COMM_SIZE = re.compile(r"\bNCCL INFO .*\brank \d+ nranks (\d+)\b")
# The column that follows busbw: "#wrong" counts wrong elements; "error" (before 2.13) and "res" (2017)
# hold the largest deviation, a float that is no count.
DEVIATION_COLUMNS = ("error", "res")


def _number(raw, number, line):
    if raw == "N/A":
        return None
    try:
        return float(raw)
    except ValueError:
        raise ParseError(TOOL, "value %r is not a number" % raw, number, line) from None


def _is_table_line(text):
    stripped = text.strip()
    return stripped.startswith("#") or bool(RESULT_ROW.match(stripped) or SUMMARY.match(stripped))


def _rank(match):
    return int(match.group("mpi_rank") or match.group("srun_rank"))


def _without_launcher_prefixes(text):
    """[(line number, line)] with launcher prefixes removed, when every table line carries one; where
    ranks each print the table (nccl-tests built without MPI), only the lowest rank's copy is kept."""
    numbered = list(enumerate(text.splitlines(), start=1))
    split = [(number, LAUNCHER_PREFIX.match(line), line) for number, line in numbered]
    table_ranks, bare_table_line = set(), False
    for _line_number, match, line in split:
        if _is_table_line(line[match.end() :] if match else line):
            if match:
                table_ranks.add(_rank(match))
            else:
                bare_table_line = True
    if not table_ranks or bare_table_line:
        return numbered
    kept_rank = min(table_ranks)
    lines = []
    for number, match, line in split:
        if not match:
            lines.append((number, line))
        elif _rank(match) == kept_rank or not _is_table_line(line[match.end() :]):
            lines.append((number, line[match.end() :]))
    return lines


def _column_header(stripped, table):
    """Notes from the header line which kind of error column the rows carry and the time unit."""
    names = stripped.lstrip("#").split()
    if "time" not in names or "algbw" not in names:
        return
    table["deviation_column"] = any(name in DEVIATION_COLUMNS for name in names)
    table["time_factor"] = 1000.0 if "res" in names else 1.0  # the 2017 format printed ms


def _wrong_cell(raw, table, number, line):
    value = _number(raw, number, line)
    if value is None or table["deviation_column"]:
        return None
    return int(value)  # "%6g" prints large counts as 1.04858e+06


def _result_row(stripped, table, number, line):
    fields = stripped.split()
    if len(fields) not in (11, 12, 13):  # older versions print no root, all_gather no redop
        raise ParseError(TOOL, "a result line has %d fields, expected 11 to 13" % len(fields), number, line)
    size, count = int(_number(fields[0], number, line)), int(_number(fields[1], number, line))
    oop, ip = fields[-8:-4], fields[-4:]
    row = {
        "size": size,
        "count": count,
        "type": fields[2],
        "redop": fields[3] if len(fields) > 11 else "none",
    }
    for placement, cells in (("oop", oop), ("ip", ip)):
        time = _number(cells[0], number, line)
        row[placement + "_time_us"] = None if time is None else time * table["time_factor"]
        row[placement + "_algbw"] = _number(cells[1], number, line)
        row[placement + "_busbw"] = _number(cells[2], number, line)
        row[placement + "_wrong"] = _wrong_cell(cells[3], table, number, line)
    return row


def _summary(match, table, number, line):
    value = _number(match.group(2), number, line)
    if match.group(1) == "Avg bus bandwidth":
        table["average"] = value
        table["average_line"] = number
    else:
        table["out_of_bounds"] = None if value is None else int(value)
    if match.group(1) == "Avg bus bandwidth" and match.group(3) == "FAILED" and table["fatal"] is None:
        table["fatal"] = line.strip()  # the average is below NCCL_TESTS_MIN_BW


def _note_markers(stripped, table):
    if table["fatal"] is None and any(marker in stripped for marker in FATAL_MARKERS):
        table["fatal"] = stripped
    if table["warning"] is None and any(marker in stripped for marker in WARNING_MARKERS):
        table["warning"] = stripped


def _validated(table):
    if table["validation_flag"] == 0:
        return False
    cells = [row[key] for row in table["rows"] for key in ("oop_wrong", "ip_wrong")]
    return table["deviation_column"] or not cells or any(cell is not None for cell in cells)


def _wrong(table, validated):
    if not validated:
        return None
    if table["deviation_column"]:
        return table["out_of_bounds"]
    counted = sum(row[key] or 0 for row in table["rows"] for key in ("oop_wrong", "ip_wrong"))
    return counted or table["out_of_bounds"] or 0  # results out of bounds are wrong whatever the cells say


def _failure(table):
    if table["fatal"] is not None:
        return table["fatal"]
    if not table["rows"]:
        return table["warning"]
    if table["average"] is None or table["average_line"] < table["last_row_line"]:
        return (
            "the table ends at line %d without the 'Avg bus bandwidth' summary: the run was cut short"
            % (table["last_row_line"])
        )
    return None


def parse_nccl_tests(text):
    """-> {"rows": [...], "avg_busbw_gb_per_s", "wrong", "validated", "out_of_bounds", "nccl_version",
    "failed", "failure", "ranks", "rank_hosts"}.

    A row: size (bytes), count, type, redop, and per placement (oop = out-of-place, ip = in-place)
    time_us, algbw and busbw (GB/s) and wrong (wrong elements; None where the test did not check or
    printed a deviation instead of a count). `validated` is false when nothing was checked (-c 0): then
    `wrong` is None, never 0. `failed` when a launcher or nccl-tests gave up or the table was cut short.
    `ranks` counts the "Using devices" lines, else the largest communicator NCCL INFO lines name (None
    where neither is printed), `rank_hosts` the hosts of the devices."""
    table = {
        "rows": [],
        "version": None,
        "average": None,
        "average_line": 0,
        "last_row_line": 0,
        "out_of_bounds": None,
        "validation_flag": None,
        "deviation_column": False,
        "time_factor": 1.0,
        "fatal": None,
        "warning": None,
        "ranks": {},
        "comm_sizes": set(),
    }
    for number, line in _without_launcher_prefixes(text):
        stripped = line.strip()
        if not stripped:
            continue
        _note_markers(stripped, table)
        match = re.search(r"\bNCCL version (\S+)", stripped)  # also inside NCCL INFO lines
        if match:
            table["version"] = match.group(1)
            continue
        match = re.search(r"\bvalidation: (\d+)", stripped)
        if match and "nThread" in stripped:
            table["validation_flag"] = int(match.group(1))
            continue
        match = COMM_SIZE.search(stripped)
        if match:
            table["comm_sizes"].add(int(match.group(1)))
            continue
        match = RANK_LINE.match(stripped)
        if match:
            table["ranks"][int(match.group(1))] = match.group(2)
            continue
        match = SUMMARY.match(stripped)
        if match:
            _summary(match, table, number, line)
            continue
        if stripped.startswith("#"):
            _column_header(stripped, table)
            continue
        if RESULT_ROW.match(stripped):
            table["rows"].append(_result_row(stripped, table, number, line))
            table["last_row_line"] = number
        # anything else is prose, banners, NCCL INFO lines (MPI's "1. Hostfile, ..." too)
    failure = _failure(table)
    if not table["rows"] and failure is None:
        line_no, line = first_nonblank(text)
        raise ParseError(TOOL, "no result table and no recognised failure", line_no, line)
    validated = _validated(table)
    return {
        "rows": table["rows"],
        "avg_busbw_gb_per_s": table["average"],
        "wrong": _wrong(table, validated),
        "validated": validated,
        "out_of_bounds": table["out_of_bounds"],
        "nccl_version": table["version"],
        "failed": failure is not None,
        "failure": failure,
        "ranks": len(table["ranks"]) or max(table["comm_sizes"] or [0]) or None,
        "rank_hosts": sorted(set(table["ranks"].values())),
    }
