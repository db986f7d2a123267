"""Medians that ignore what was not observed (NaN), by sort: np.nanmedian takes a masked-array path
that costs a fleet's diagnosis cycle most of its budget (the same trick as inference._median)."""

from __future__ import annotations

import numpy as np


def nanmedian(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """The median over `axis` of the non-NaN values (NaN where there is none)."""
    data = np.asarray(values, dtype=np.float64)
    if axis is None:
        data, axis = data.reshape(-1), 0
    ordered = np.moveaxis(np.sort(data, axis=axis), axis, 0)  # NaN sorts last
    count = (~np.isnan(ordered)).sum(axis=0)
    low = np.take_along_axis(ordered, (np.maximum(count - 1, 0) // 2)[None], axis=0)[0]
    high = np.take_along_axis(ordered, (count // 2)[None], axis=0)[0]
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, (low + high) / 2, np.nan)
