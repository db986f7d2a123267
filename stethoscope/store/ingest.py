"""`stethoscope ingest FILE.ndjson`: metric rows as in the `metrics` table, one JSON object a line."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import to_ms


@dataclass
class ParsedFile:
    metrics: MetricColumns = field(default_factory=MetricColumns)
    errors: list[str] = field(default_factory=list)


def parse_ndjson(path: Path, catalog: Catalog) -> ParsedFile:
    """Rows that are valid are kept; each bad line is reported as file:line with the reason."""
    parsed = ParsedFile()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
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
            parsed.metrics.append(
                str(row["node_id"]),
                row["metric_name"],
                str(row.get("device") or ""),
                {str(k): str(v) for k, v in (row.get("labels") or {}).items()},
                float(row["value"]),
                to_ms(row["timestamp"]),
            )
    return parsed


def _row_problem(row: dict, catalog: Catalog) -> str | None:
    for key in ("node_id", "metric_name", "value", "timestamp"):
        if key not in row:
            return f"missing field {key!r}"
    if row["metric_name"] not in catalog:
        return f"unknown metric {row['metric_name']!r} (not in rules/metrics.yml)"
    labels = row.get("labels") or {}
    if not isinstance(labels, dict):
        return "labels must be an object"
    try:
        value = float(row["value"])
    except (TypeError, ValueError):
        return f"value {row['value']!r} is not a number"
    if math.isnan(value) or math.isinf(value):
        return f"value {row['value']!r} is not finite"
    try:
        to_ms(row["timestamp"])
    except (TypeError, ValueError):
        return f"timestamp {row['timestamp']!r} is neither ISO-8601 nor epoch seconds"
    return None
