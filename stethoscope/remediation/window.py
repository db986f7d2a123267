"""The window re-baselines run in (`stethoscope_rebaseline_window`, docs/remediation.md "Re-baselines
and verify that run themselves"): read by the executor's settings when a command starts, and by each
cycle that plans re-baselines (remediation.rebaseline)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from stethoscope.store.dsn import ConfigError

WINDOW_SETTING = "stethoscope_rebaseline_window"
NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WINDOW = re.compile(r"(?P<days>\S+)\s+(?P<start>\d{1,2}:\d{2})-(?P<end>\d{1,2}:\d{2})")


@dataclass(frozen=True)
class Window:
    """When re-baselines may run, in UTC: `DAYS HH:MM-HH:MM` where DAYS is `daily`, a day (`sat`),
    a list (`sat,sun`) or a range (`mon-fri`); an end before the start runs past midnight (the day
    named is the start's). `always`: any time."""

    text: str
    days: frozenset[int]
    start_min: int
    end_min: int

    @classmethod
    def parse(cls, text: Any) -> Window | None:
        """None when no window is set; ConfigError naming the setting when it cannot be read."""
        if text is None or str(text).strip() == "":
            return None
        spoken = str(text).strip().lower()
        if spoken == "always":
            return cls(str(text), frozenset(range(7)), 0, 24 * 60)
        found = _WINDOW.fullmatch(spoken)
        if found is None:
            raise ConfigError(
                f"{WINDOW_SETTING}: {str(text)!r} is not `DAYS HH:MM-HH:MM` (e.g. `sat 02:00-06:00`, "
                "`mon-fri 22:00-04:00`, `daily 01:00-03:00`) nor `always`"
            )
        start, end = _minutes(found["start"]), _minutes(found["end"])
        if start == end:
            raise ConfigError(f"{WINDOW_SETTING}: {str(text)!r} is empty (its start is its end)")
        return cls(str(text), _days(found["days"]), start, end)

    def open_at(self, at_ms: int) -> bool:
        moment = datetime.fromtimestamp(at_ms / 1000, UTC)
        minute, day = moment.hour * 60 + moment.minute, moment.weekday()
        if self.start_min < self.end_min:
            return day in self.days and self.start_min <= minute < self.end_min
        # past midnight: the evening of a day named, or the morning after one
        return (day in self.days and minute >= self.start_min) or (
            (day - 1) % 7 in self.days and minute < self.end_min
        )


def _minutes(text: str) -> int:
    hours, minutes = (int(part) for part in text.split(":"))
    if hours > 24 or minutes > 59 or (hours == 24 and minutes):
        raise ConfigError(f"{WINDOW_SETTING}: {text!r} is not a time of day")
    return hours * 60 + minutes


def _days(text: str) -> frozenset[int]:
    if text in ("daily", "*"):
        return frozenset(range(7))
    days: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        a = _day(first, part)
        b = _day(last, part) if dash else a
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(days)


def _day(name: str, part: str) -> int:
    """A day's index: its three letters (`sat`) or its whole name (`saturday`), nothing in between."""
    for index, day in enumerate(NAMES):
        if name in (day[:3], day):
            return index
    raise ConfigError(f"{WINDOW_SETTING}: {part!r} is not a day (mon … sun, monday … sunday, daily)")
