"""The controller's one median / relative-standard-deviation helper (node-side module_utils keep
their own: they cannot import the controller)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values))


def stdev(values: Sequence[float]) -> float:
    """Sample standard deviation; 0 for fewer than two values."""
    return float(statistics.stdev(values)) if len(values) >= 2 else 0.0


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation from the median (unscaled)."""
    centre = median(values)
    return median([abs(v - centre) for v in values])


def rsd_percent(values: Sequence[float]) -> float:
    """Sample standard deviation over the mean, in percent; 0 for fewer than two values or a zero mean."""
    if len(values) < 2:
        return 0.0
    centre = mean(values)
    return 0.0 if centre == 0 else stdev(values) / abs(centre) * 100.0
