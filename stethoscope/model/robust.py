"""The model's one median that ignores what was not observed (NaN), by sort: np.nanmedian takes a
masked-array path that took seconds of a fleet's diagnosis cycle (the peers' medians of inference.py,
the job-relative detector's, the switches')."""

from __future__ import annotations

import numpy as np


def nanmedian(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """The median over `axis` of the non-NaN values (NaN where there is none), in the values' own
    floating type (a fleet's float32 windows are not copied to float64). By sort (NaN sorts last)
    and the middle of each position's observed count."""
    data = np.asarray(values)
    if not np.issubdtype(data.dtype, np.floating):
        data = data.astype(np.float64)
    if axis is None:
        data, axis = data.reshape(-1), 0
    ordered = np.moveaxis(np.sort(data, axis=axis), axis, 0)
    count = (~np.isnan(ordered)).sum(axis=0)
    low = np.take_along_axis(ordered, (np.maximum(count - 1, 0) // 2)[None], axis=0)[0]
    high = np.take_along_axis(ordered, (count // 2)[None], axis=0)[0]
    with np.errstate(invalid="ignore"):
        return np.where(count > 0, (low + high) / 2, np.nan).astype(data.dtype, copy=False)
