"""Timestamps as the store keeps them: integer milliseconds since the epoch, UTC."""

from __future__ import annotations

import datetime as dt
import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def to_ms(value: object) -> int:
    """Accept epoch seconds (int/float), epoch milliseconds-as-int from the store, or ISO-8601 text."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {value!r}")
    if isinstance(value, int | float):
        return round(float(value) * 1000)
    if isinstance(value, dt.datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return round(moment.timestamp() * 1000)
    if isinstance(value, str):
        text = value.strip()
        try:
            return round(float(text) * 1000)
        except ValueError:
            pass
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return round(moment.timestamp() * 1000)
    raise ValueError(f"not a timestamp: {value!r}")


def iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).isoformat(timespec="milliseconds")
