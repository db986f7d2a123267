"""Turn one task result into store rows (docs/design.md "Module result shape"); results are only read."""

from __future__ import annotations

import json
import math
from typing import Any

from stethoscope.store.batch import Batch


def _labels(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def rows_from_result(node_id: str, result: dict[str, Any], run_id: str, now_ms: int) -> Batch:
    batch = Batch()
    for row in result.get("stethoscope_metrics") or []:
        if not isinstance(row, dict) or "name" not in row:
            continue
        try:
            value = float(row.get("value"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if math.isnan(value) or math.isinf(value):
            continue
        batch.metrics.append(
            node_id, str(row["name"]), str(row.get("device") or ""), _labels(row.get("labels")), value, now_ms
        )
    for key, value in (result.get("ansible_facts") or {}).items():
        if key.startswith("stethoscope_"):
            batch.facts.append(
                {
                    "node_id": node_id,
                    "collector": key[len("stethoscope_") :],
                    "run_id": run_id,
                    "collected_at": now_ms,
                    "facts": json.dumps(value, sort_keys=True, default=str),
                }
            )
    bench = result.get("stethoscope_bench")
    if isinstance(bench, dict):
        _bench_rows(batch, node_id, bench, run_id, now_ms)
    return batch


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
            continue
        batch.bench.append(
            {
                "run_id": str(bench.get("run_id") or run_id),
                "node_id": node_id,
                "suite": str(bench.get("suite", "")),
                "metric_name": str(item["metric_name"]),
                "device": str(item.get("device") or ""),
                "labels": _labels(item.get("labels")),
                "value": float(item["value"]),
                "unit": str(item.get("unit") or ""),
                "repetition": int(item.get("repetition") or 0),
                "class_fingerprint": class_fp,
                "node_fingerprint": node_fp,
                "unstable": int(bool(item.get("unstable"))),
                "timestamp": now_ms,
            }
        )
