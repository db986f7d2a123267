"""Timestamps as the store keeps them: integer milliseconds since the epoch, UTC.

Every time a row may carry lies within ClickHouse's DateTime64 range (1900-01-01 to 2299-12-31): a
time outside it (Infinity, 1e300 seconds, year 1) is a ValueError naming the value, never an
OverflowError and never an insert that fails for a whole batch.
"""

from __future__ import annotations

import datetime as dt
import math
import time

MIN_MS = -2_208_988_800_000  # 1900-01-01T00:00:00Z
MAX_MS = 10_413_791_999_999  # 2299-12-31T23:59:59.999Z


class TimeRangeError(ValueError):
    """A number or date that is a time, but none the store can hold."""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def to_ms(value: object) -> int:
    """Accept epoch seconds (int/float), epoch milliseconds-as-int from the store, or ISO-8601 text."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {value!r}")
    if isinstance(value, int) and not MIN_MS <= value * 1000 <= MAX_MS:  # 10**400 is no float
        raise TimeRangeError(f"timestamp {value!r:.40} is outside the years 1900 to 2299 the store can hold")
    if isinstance(value, int | float):
        return _checked(float(value) * 1000, value)
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return _checked(moment.timestamp() * 1000, value)
    if isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pass
        else:
            return _checked(seconds * 1000, value)
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return _checked(moment.timestamp() * 1000, value)
    raise ValueError(f"not a timestamp: {value!r}")


def _checked(ms: float, given: object) -> int:
    if not math.isfinite(ms) or not MIN_MS <= ms <= MAX_MS:
        raise TimeRangeError(f"timestamp {given!r:.40} is outside the years 1900 to 2299 the store can hold")
    return round(ms)


def in_range(ms: object) -> bool:
    """Whether `ms` is an epoch-milliseconds time the store can hold (a bool is no time)."""
    if isinstance(ms, bool) or not isinstance(ms, int | float):
        return False
    return MIN_MS <= ms <= MAX_MS  # NaN compares false, and an integer of any size compares


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
