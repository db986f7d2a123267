"""How an increase's reach (lookback, start, end] splits into whole hours, which metrics_hourly
answers, and the partial hours at its ends and around the window's start, which only the raw rows can.

An hour [H, H + 1 h) is whole on one side of `start` when all of it is there: before the window
(`lookback` < t <= `start`) or inside it (`start` < t <= `end`). Times are epoch milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Spans:
    lookback: int  # exclusive: the earliest sample an increase may start from is after it
    before: tuple[int, int]  # [first, last) whole hours at or before the window's start
    inside: tuple[int, int]  # [first, last) whole hours inside the window
    end: int  # inclusive

    @property
    def raw(self) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        """The three [from, to) stretches of raw rows around the whole hours, clipped to
        (lookback, end]: the head of the lookback, the hour holding `start`, the tail."""
        low, high = self.lookback + 1, self.end + 1
        stretches = ((low, self.before[0]), (self.before[1], self.inside[0]), (self.inside[1], high))
        return tuple((max(lo, low), min(hi, high)) for lo, hi in stretches)  # type: ignore[return-value]


def spans(lookback_ms: int, start_ms: int, end_ms: int) -> Spans:
    def after(t: int) -> int:  # the first hour that begins after t
        return (t // HOUR_MS + 1) * HOUR_MS

    def through(t: int) -> int:  # the end of the last hour that ends at or before t
        return (t + 1) // HOUR_MS * HOUR_MS

    before_to = through(start_ms)
    before_from = min(after(lookback_ms), before_to)
    inside_from = after(start_ms)
    inside_to = max(through(end_ms), inside_from)
    return Spans(lookback_ms, (before_from, before_to), (inside_from, inside_to), end_ms)
