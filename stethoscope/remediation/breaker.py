"""The circuit breaker (docs/design.md "Remediation safety"), two limits, each max(1, floor(fraction × N))
of the inventory: nodes isolated at once (stethoscope's drains not yet resumed, those in flight, and
what Slurm shows DRAIN or DOWN, human drains included) and new isolations within a sliding window.
Past either, a drain is refused and alerted instead. Permits are taken under a lock: findings act in
parallel."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field


def limit(fraction: float, fleet_size: int) -> int:
    return max(1, math.floor(fraction * fleet_size))


@dataclass
class CircuitBreaker:
    fleet_size: int
    fraction: float = 0.10  # nodes isolated at once
    window_seconds: int = 3600
    window_fraction: float = 0.10  # new isolations within the window
    isolated: set[str] = field(default_factory=set)  # out of service now, drains under way included
    recent: set[str] = field(default_factory=set)  # isolated by stethoscope within the window
    slurm_note: str = ""  # how the isolated set was learned (whether Slurm could be asked)
    _reserved: set[str] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def allowed(self) -> int:
        return limit(self.fraction, self.fleet_size)

    @property
    def allowed_in_window(self) -> int:
        return limit(self.window_fraction, self.fleet_size)

    def permit(self, node: str) -> tuple[bool, str]:
        """Reserve an isolation of `node`, or say why not; `release` gives back one that failed."""
        with self._lock:
            allowed, why = self._room(node)
            if allowed and node not in self.isolated:
                self.isolated.add(node)
                self.recent.add(node)
                self._reserved.add(node)
            return allowed, why

    def room(self, node: str) -> tuple[bool, str]:
        """Whether `node` could be isolated now, and why not; reserves nothing (`permit` does)."""
        with self._lock:
            return self._room(node)

    def _room(self, node: str) -> tuple[bool, str]:
        if node in self.isolated:
            return True, f"{node} is already out of service"
        if len(self.isolated) >= self.allowed:
            return False, (
                f"circuit breaker: {len(self.isolated)} of {self.fleet_size} nodes isolated now "
                f"({', '.join(sorted(self.isolated))}{self.slurm_note}), the limit is {self.allowed} "
                f"({self.fraction:.0%}, at least 1); not draining {node}"
            )
        if len(self.recent) >= self.allowed_in_window:
            return False, (
                f"circuit breaker: {len(self.recent)} of {self.fleet_size} nodes newly isolated within "
                f"{self.window_seconds} s, the limit is {self.allowed_in_window} "
                f"({self.window_fraction:.0%}, at least 1); not draining {node}"
            )
        return True, "within the circuit breaker's limits"

    def release(self, node: str) -> None:
        with self._lock:
            if node in self._reserved:
                self._reserved.discard(node)
                self.isolated.discard(node)
                self.recent.discard(node)
