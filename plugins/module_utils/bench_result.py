# Copyright: stethoscope developers
# Apache License 2.0
"""The `stethoscope_bench` result every benchmark module returns, with repetition stability.

A metric (name, device, labels) measured N times is `unstable` when the relative standard deviation
of its values exceeds the threshold (3 % by default): stored all the same, and flagged."""

from __future__ import annotations

import json
import math

from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric

DEFAULT_MAX_RSD_PERCENT = 3.0


def relative_stddev_percent(values):
    """Sample standard deviation over the mean, in percent; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    if mean == 0:
        return 0.0
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(variance) / abs(mean) * 100.0


def _key(item):
    return (item["metric_name"], item.get("device", ""), json.dumps(item.get("labels") or {}, sort_keys=True))


def bench_result(suite, measurements, fingerprint=None, max_rsd_percent=DEFAULT_MAX_RSD_PERCENT):
    """measurements: [{metric_name, device, labels, value, unit, repetition}] -> (stethoscope_bench,
    stethoscope_metrics rows with the median per metric, stability per metric)."""
    groups = {}
    for item in measurements:
        groups.setdefault(_key(item), []).append(item)
    results, rows, stability = [], [], []
    for (name, device, labels_json), items in sorted(groups.items()):
        values = [item["value"] for item in items]
        rsd = relative_stddev_percent(values)
        unstable = len(values) > 1 and rsd > max_rsd_percent
        labels = json.loads(labels_json)
        for item in items:
            results.append(dict(item, device=device, labels=labels, unstable=unstable))
        ordered = sorted(values)
        middle = len(ordered) // 2
        median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0
        rows.append(metric(name, device, median, dict(labels, stat="median")))
        stability.append(
            {
                "metric_name": name,
                "device": device,
                "labels": labels,
                "repetitions": len(values),
                "median": median,
                "rsd_percent": round(rsd, 3),
                "unstable": unstable,
            }
        )
    fingerprint = fingerprint or {}
    bench = {
        "suite": suite,
        "class_fingerprint": fingerprint.get("class_fingerprint", ""),
        "node_fingerprint": fingerprint.get("node_fingerprint", ""),
        "fingerprint_detail": fingerprint.get("detail", {}),
        "repetitions": max([item.get("repetition", 0) for item in measurements] or [0]),
        "results": results,
    }
    return bench, rows, stability
