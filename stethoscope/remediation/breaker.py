"""The circuit breaker (docs/design.md "Remediation safety"): no more than `fraction` of the fleet isolated
within `window`, and always at least one node; past that, drains are refused and alerted instead."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class CircuitBreaker:
    fleet_size: int
    fraction: float = 0.10
    window_seconds: int = 3600
    drained: set[str] = field(default_factory=set)  # nodes drained within the window, this run included

    @property
    def allowed(self) -> int:
        return max(1, math.floor(self.fraction * self.fleet_size))

    def permit(self, node: str) -> tuple[bool, str]:
        if node in self.drained:
            return True, f"{node} already drained within the window"
        if len(self.drained) >= self.allowed:
            return False, (
                f"circuit breaker: {len(self.drained)} of {self.fleet_size} nodes drained within "
                f"{self.window_seconds} s, the limit is {self.allowed} ({self.fraction:.0%}, at least 1); "
                f"not draining {node}"
            )
        return True, "within the circuit breaker's limit"

    def record(self, node: str) -> None:
        self.drained.add(node)
