"""Timestamps as the store keeps them: integer milliseconds since the epoch, UTC.

Every time a row may carry lies within ClickHouse's DateTime64 range (1900-01-01 to 2299-12-31): a
time outside it (Infinity, 1e300 seconds, year 1) is a ValueError naming the value, never an
OverflowError and never an insert that fails for a whole batch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
import time

MIN_MS = -2_208_988_800_000  # 1900-01-01T00:00:00Z
MAX_MS = 10_413_791_999_999  # 2299-12-31T23:59:59.999Z
_DURATION = re.compile(r"^(\d+(?:\.\d+)?|\.\d+)\s*(s|m|h|d|w)?$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
DURATION_SYNTAX = "90s, 15m, 1.5h, 2d, 1w or plain seconds"
DAY_SECONDS = 86400
DAYS_SYNTAX = "a number of days (7, 0.5) or a duration (36h, 2d, 1w)"
WHOLE_DAYS_SYNTAX = "whole days (7, 14) or a duration of them (48h, 2w)"


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


class DurationError(ValueError):
    """Text that is not a duration."""


def parse_duration(text: object) -> float:
    """The one duration syntax of every option and setting: '90s', '15m', '1.5h', '2d', '1w', or plain
    seconds ('300', '2.5') -> seconds; DurationError naming the text otherwise."""
    if isinstance(text, bool):
        raise DurationError(f"{text!r:.60} is not a duration ({DURATION_SYNTAX})")
    match = _DURATION.match(str(text).strip())
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"] if match else math.nan
    if not math.isfinite(seconds) or seconds * 1000 > MAX_MS:
        raise DurationError(f"{text!r:.60} is not a duration ({DURATION_SYNTAX})")
    return int(seconds) if seconds.is_integer() else seconds


TIMER_FLOOR_SECONDS = 1  # the least period of a timer (a sweep, a scrape, a heartbeat): less spins


def positive_seconds(value: object, *, whole: bool = False, least: float = 0) -> float:
    """A duration setting (a number of seconds, or its text in the one syntax: '90s', '1.5h') -> seconds,
    more than 0 and at least `least`, and a whole number of them with `whole` ('1.5m' is; '2.5s' is
    not); DurationError (a ValueError) naming the value, the rule and the syntax otherwise."""
    try:
        seconds = parse_duration(value)
    except DurationError:
        seconds = 0
    if not (seconds > 0 and seconds >= least and (not whole or float(seconds).is_integer())):
        rule = f"at least {least:g}s" if least > 0 else "above 0"
        kind = "duration of whole seconds" if whole else "duration"
        raise DurationError(f"{value!r:.60} is not a {kind} {rule} ({DURATION_SYNTAX})")
    return int(seconds) if whole else seconds


def duration_option(text: str) -> float:
    """argparse's type for a duration option: a bad one is exit 2 naming the option and the value."""
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def days_of(text: object) -> float:
    """A span counted in days: a bare number is days ('7', '0.5'), anything else the one duration syntax
    ('36h', '1w') -> days; DurationError naming the text otherwise."""
    stripped = str(text).strip()
    bare = _DURATION.match(stripped)
    try:
        seconds = parse_duration(stripped + "d" if bare and not bare.group(2) else stripped)
    except DurationError:
        raise DurationError(f"{text!r:.60} is not {DAYS_SYNTAX}") from None
    return seconds / DAY_SECONDS


def days_option(text: str) -> float:
    """argparse's type for an option counted in days (days_of), above 0: a bad one is exit 2 naming the
    option and the value."""
    try:
        days = days_of(text)
    except DurationError:
        days = 0.0
    if days <= 0:
        raise argparse.ArgumentTypeError(f"{text!r:.60} is not a span above 0 ({DAYS_SYNTAX})")
    return int(days) if days.is_integer() else days


def whole_days_option(text: str) -> int:
    """argparse's type for an option counted in whole days, at least 1 ('14', '2w', '48h'; not '36h')."""
    try:
        days = days_of(text)
    except DurationError:
        days = 0.0
    if days < 1 or not days.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r:.60} is not whole days, at least 1 ({WHOLE_DAYS_SYNTAX})")
    return int(days)


def moment_ms(text: str, until_ms: int) -> int:
    """A time given as a duration before `until_ms` (with its unit: 2h, 1.5d), ISO-8601 or epoch seconds
    (a bare number is a moment here, never seconds ago); ValueError when it is none of them."""
    bare = text.strip().replace(".", "", 1).isdigit()
    if not bare:
        try:
            return until_ms - round(parse_duration(text) * 1000)
        except DurationError:
            pass
    return to_ms(text)
