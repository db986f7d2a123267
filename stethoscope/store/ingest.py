"""`stethoscope ingest FILE.ndjson|-`: metric rows as in the `metrics` table, one JSON object a line."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from stethoscope.catalog import Catalog
from stethoscope.names import is_metric_name, name_problem
from stethoscope.store.batch import MetricColumns
from stethoscope.store.result_rows import INFINITE, NAN, value_problem
from stethoscope.timeutil import TimeRangeError, now_ms, to_ms

FUTURE_TOLERANCE_MS = 5 * 60_000  # clocks drift; beyond this a timestamp is wrong, not early
DAY_MS = 86_400_000


@dataclass
class ParsedFile:
    metrics: MetricColumns = field(default_factory=MetricColumns)
    errors: list[str] = field(default_factory=list)
    future: list[str] = field(default_factory=list)  # file:line of rows rejected for a future timestamp


@contextlib.contextmanager
def _lines(source: Path) -> Iterator[TextIO]:
    if str(source) == "-":
        yield sys.stdin
        return
    with open(source, encoding="utf-8", errors="replace") as handle:
        yield handle


def parse_ndjson(source: Path, catalog: Catalog, now: int | None = None) -> ParsedFile:
    """Rows that are valid are kept; each bad line is reported as file:line with the reason.

    `source` "-" reads standard input. A timestamp more than FUTURE_TOLERANCE_MS after `now` is rejected.
    """
    parsed = ParsedFile()
    latest = (now if now is not None else now_ms()) + FUTURE_TOLERANCE_MS
    name = "<stdin>" if str(source) == "-" else str(source)
    with _lines(source) as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{name}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                parsed.errors.append(f"{where}: not JSON ({exc.msg})")
                continue
            if not isinstance(row, dict):
                parsed.errors.append(f"{where}: expected an object")
                continue
            problem = _row_problem(row, catalog)
            if problem:
                parsed.errors.append(f"{where}: {problem}")
                continue
            timestamp = to_ms(row["timestamp"])
            if timestamp > latest:
                parsed.future.append(where)
                continue
            parsed.metrics.append(
                row["node_id"],
                row["metric_name"],
                row.get("device") or "",
                {k: str(v) for k, v in (row.get("labels") or {}).items()},
                value_problem(row["value"])[0],
                timestamp,
            )
    return parsed


def older_than(metrics: MetricColumns, days: int, now: int | None = None) -> int:
    """How many rows a raw TTL of `days` expires at the next merge."""
    cutoff = (now if now is not None else now_ms()) - days * DAY_MS
    return sum(1 for timestamp in metrics.timestamp if timestamp < cutoff)


def _row_problem(row: dict, catalog: Catalog) -> str | None:
    """Why a line's row cannot be stored, or None: each field of the shape the table holds."""
    for key in ("node_id", "metric_name", "value", "timestamp"):
        if key not in row:
            return f"missing field {key!r}"
    if not isinstance(row["node_id"], str) or not row["node_id"]:
        return f"node_id {row['node_id']!r} must be a non-empty text"
    if not is_metric_name(row["metric_name"]):
        return f"metric_name {ascii(row['metric_name'])[:80]} is not a metric name"
    if row["metric_name"] not in catalog:
        return f"unknown metric {row['metric_name']!r} (not in rules/metrics.yml)"
    if row.get("device") is not None and not isinstance(row["device"], str):
        return f"device {row['device']!r} must be a text"
    labels = {} if row.get("labels") is None else row["labels"]
    if not isinstance(labels, dict) or not all(isinstance(v, str | int | float) for v in labels.values()):
        return "labels must be an object of texts or numbers"
    named = name_problem(row["node_id"], row.get("device") or "", labels)
    if named:
        return named
    _value, problem = value_problem(row["value"])
    if problem in (NAN, INFINITE):
        return f"value {row['value']!r} is not finite"
    if problem:
        return f"value {row['value']!r} is not a number"
    try:
        to_ms(row["timestamp"])
    except TimeRangeError as exc:
        return str(exc)
    except (TypeError, ValueError):
        return f"timestamp {row['timestamp']!r} is neither ISO-8601 nor epoch seconds"
    return None
