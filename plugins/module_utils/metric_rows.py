# Copyright: stethoscope developers
# Apache License 2.0
"""Rows of `stethoscope_metrics`: {name, device, value, labels} with catalog names (docs/design.md)."""

from __future__ import annotations


def metric(name, device, value, labels=None):
    return {"name": name, "device": device, "value": float(value), "labels": dict(labels or {})}


def add(rows, name, device, value, labels=None):
    """Append a row unless the value is unknown (None): a missing reading is not a zero."""
    if value is not None:
        rows.append(metric(name, device, value, labels))
