"""Turn one task result into store rows (docs/design.md "Module result shape"); results are only read.

A looped task's items (`results[i]`) count as results of their own. A value that is not a finite
number loses only its own row: it goes to `Batch.rejected` with the reason, never silently away.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from stethoscope.names import is_metric_name, name_problem
from stethoscope.store.batch import Batch

NOT_A_NUMBER, NAN, INFINITE = "not a number", "NaN", "Inf"


def _labels(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def value_problem(raw: Any) -> tuple[float, str | None]:
    """The value as a float, or the reason it cannot be stored (NOT_A_NUMBER, NAN, INFINITE)."""
    if isinstance(raw, bool):
        return 0.0, NOT_A_NUMBER
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        return 0.0, NOT_A_NUMBER
    if math.isnan(value):
        return value, NAN
    if math.isinf(value):
        return value, INFINITE
    return value, None


def parts_of(result: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The result itself and, for a looped task, each item's result."""
    yield result
    items = result.get("results")
    if isinstance(items, list):
        yield from (item for item in items if isinstance(item, dict))


def carries_rows(result: dict[str, Any]) -> bool:
    return any(
        "stethoscope_metrics" in part
        or "stethoscope_bench" in part
        or any(str(k).startswith("stethoscope_") for k in (part.get("ansible_facts") or {}))
        for part in parts_of(result)
    )


def rows_from_result(node_id: str, result: dict[str, Any], run_id: str, now_ms: int) -> Batch:
    batch = Batch()
    for part in parts_of(result):
        _metric_rows(batch, node_id, part, now_ms)
        _fact_rows(batch, node_id, part, run_id, now_ms)
        bench = part.get("stethoscope_bench")
        if isinstance(bench, dict):
            _bench_rows(batch, node_id, bench, run_id, now_ms)
    return batch


def _reject(batch: Batch, table: str, node_id: str, reason: str, row: Any) -> None:
    batch.rejected.append({"table": table, "node_id": node_id, "reason": reason, "row": row})


def _metric_rows(batch: Batch, node_id: str, part: dict[str, Any], now_ms: int) -> None:
    for row in part.get("stethoscope_metrics") or []:
        if not isinstance(row, dict) or "name" not in row:
            _reject(batch, "metrics", node_id, "not a metric row (no name)", row)
            continue
        value, problem = value_problem(row.get("value"))
        device, labels = str(row.get("device") or ""), _labels(row.get("labels"))
        problem = problem or name_problem(node_id, device, labels)
        if not problem and not is_metric_name(row["name"]):
            problem = "metric_name not a metric name"
        if problem:
            _reject(batch, "metrics", node_id, problem, row)
            continue
        batch.metrics.append(node_id, str(row["name"]), device, labels, value, now_ms)


def _fact_rows(batch: Batch, node_id: str, part: dict[str, Any], run_id: str, now_ms: int) -> None:
    for key, value in (part.get("ansible_facts") or {}).items():
        if str(key).startswith("stethoscope_"):
            batch.facts.append(
                {
                    "node_id": node_id,
                    "collector": key[len("stethoscope_") :],
                    "run_id": run_id,
                    "collected_at": now_ms,
                    "facts": json.dumps(value, sort_keys=True, default=str),
                }
            )


def _bench_rows(batch: Batch, node_id: str, bench: dict[str, Any], run_id: str, now_ms: int) -> None:
    class_fp, node_fp = str(bench.get("class_fingerprint", "")), str(bench.get("node_fingerprint", ""))
    detail = json.dumps(bench.get("fingerprint_detail") or {}, sort_keys=True, default=str)
    for kind, fingerprint in (("class", class_fp), ("node", node_fp)):
        if fingerprint:
            batch.fingerprints.append(
                {
                    "fingerprint": fingerprint,
                    "kind": kind,
                    "node_id": node_id,
                    "detail": detail,
                    "first_seen": now_ms,
                }
            )
    for item in bench.get("results") or []:
        if not isinstance(item, dict) or "metric_name" not in item:
            _reject(batch, "bench_results", node_id, "not a benchmark row (no metric_name)", item)
            continue
        value, problem = value_problem(item.get("value"))
        try:
            repetition = int(item.get("repetition") or 0)
        except (TypeError, ValueError):
            problem = problem or "repetition not an integer"
        problem = problem or name_problem(node_id, str(item.get("device") or ""), _labels(item.get("labels")))
        if not problem and not is_metric_name(item["metric_name"]):
            problem = "metric_name not a metric name"
        if problem:
            _reject(batch, "bench_results", node_id, problem, item)
            continue
        batch.bench.append(
            {
                "run_id": str(bench.get("run_id") or run_id),
                "node_id": node_id,
                "suite": str(bench.get("suite", "")),
                "metric_name": str(item["metric_name"]),
                "device": str(item.get("device") or ""),
                "labels": _labels(item.get("labels")),
                "value": value,
                "unit": str(item.get("unit") or ""),
                "repetition": repetition,
                "class_fingerprint": class_fp,
                "node_fingerprint": node_fp,
                "unstable": int(bool(item.get("unstable"))),
                "timestamp": now_ms,
            }
        )
