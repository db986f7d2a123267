"""The executor's settings, from the inventory and -e, each checked against its range when a command
starts: `diagnose --execute`, `watch --execute` and `serve --execute` exit 2 with a line naming the
setting rather than act with a value nobody meant (a breaker window of `bogus` read as an hour, a
fraction of 7 letting every node go)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.retries import Backoff
from stethoscope.remediation.window import WINDOW_SETTING, Window
from stethoscope.store.dsn import ConfigError
from stethoscope.timeutil import TIMER_FLOOR_SECONDS, DurationError, positive_seconds


class Configured(Protocol):
    def setting(self, name: str, default: Any = None) -> Any: ...


@dataclass(frozen=True)
class Settings:
    """`of` raises ConfigError naming a bad setting: `cli.diagnose.executor_factory` calls it when the
    context is built, so `diagnose`, `watch` and `serve --execute` exit 2 at start rather than fail
    every cycle."""

    backoff: Backoff
    window_ms: int  # stethoscope_incident_window
    isolated_fraction: float  # stethoscope_breaker_isolated_fraction (default stethoscope_breaker_fraction)
    window_fraction: float  # stethoscope_breaker_window_fraction (default stethoscope_breaker_fraction)
    breaker_window_seconds: int  # stethoscope_breaker_window
    min_isolations: int  # stethoscope_breaker_min_isolations: the floor of stethoscope's own limits
    playbook_timeout: int  # seconds
    parallel: int
    http_timeout: float
    http_retries: int
    beat_seconds: float  # stethoscope_executor_beat: one for all the executors of a database
    rebaseline_window: Window | None  # stethoscope_rebaseline_window; None: re-baselines never run
    # stethoscope_rebaseline_timeout: an automatic re-baseline's or verify's run (baseline.yml's suites)
    rebaseline_timeout: int = 4 * 3600

    @classmethod
    def of(cls, context: Configured) -> Settings:
        backoff = Backoff.from_settings(context.setting)
        fraction = fraction_setting(context, "stethoscope_breaker_fraction", 0.10)
        floor = whole(context, "stethoscope_breaker_min_isolations", 1, least=1)
        hosts = getattr(getattr(context, "inventory", None), "hosts", None)
        if hosts is not None and floor > len(hosts):  # a floor past the fleet would disable the limits
            raise ConfigError(
                f"stethoscope_breaker_min_isolations: {floor} is more than the inventory's {len(hosts)} nodes"
            )
        window = Window.parse(context.setting(WINDOW_SETTING))  # ConfigError when unreadable
        return cls(
            backoff,
            duration(context, "stethoscope_incident_window", "1h") * 1000,
            fraction_setting(context, "stethoscope_breaker_isolated_fraction", fraction),
            fraction_setting(context, "stethoscope_breaker_window_fraction", fraction),
            duration(context, "stethoscope_breaker_window", "1h"),
            floor,
            duration(context, "stethoscope_playbook_timeout", "30m"),
            whole(context, "stethoscope_executor_parallel", 4, least=1),
            seconds(context, "stethoscope_http_timeout", 10.0),
            whole(context, "stethoscope_http_retries", 3, least=0),
            seconds(context, "stethoscope_executor_beat", 60.0, least=TIMER_FLOOR_SECONDS),
            window,
            duration(context, "stethoscope_rebaseline_timeout", "4h"),
        )

    def breaker(self, fleet_size: int) -> CircuitBreaker:
        """A circuit breaker of these limits for a fleet of `fleet_size` nodes, not armed yet."""
        return CircuitBreaker(
            fleet_size,
            self.isolated_fraction,
            self.breaker_window_seconds,
            self.window_fraction,
            self.min_isolations,
        )


def duration(context: Configured, name: str, default: str) -> int:
    """Whole seconds of a duration setting (5m, 1.5h, or whole seconds above 0)."""
    return int(seconds(context, name, default, whole=True))


def seconds(
    context: Configured, name: str, default: float | str, whole: bool = False, least: float = 0
) -> float:
    """Seconds of a duration setting (2.5s, 1m, or seconds above 0 and at least `least`)."""
    try:
        return positive_seconds(context.setting(name, default), whole=whole, least=least)
    except DurationError as exc:
        raise ConfigError(f"{name}: {exc}") from None


def fraction_setting(context: Configured, name: str, default: float) -> float:
    """A fraction of the inventory: 0 < f ≤ 1."""
    value = _float(context, name, default)
    if not 0 < value <= 1:
        given = context.setting(name, default)
        raise ConfigError(f"{name}: {given!r} is not a fraction above 0 and at most 1")
    return value


def whole(context: Configured, name: str, default: int, least: int) -> int:
    value = context.setting(name, default)
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit() or int(text) < least:
        raise ConfigError(f"{name}: {value!r} is not a whole number of at least {least}")
    return int(text)


def _float(context: Configured, name: str, default: float) -> float:
    value = context.setting(name, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number):
        raise ConfigError(f"{name}: {value!r} is not a number")
    return number
