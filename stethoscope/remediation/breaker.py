"""The circuit breaker (docs/design.md "Remediation safety"): how many nodes stethoscope may take out of
service, with three limits, so that a small cluster can still isolate a failing node while a fleet
whose nodes are already going down is left alone:

- its own isolations (its drains not yet resumed, those in flight) ≤ max(floor, ⌊f × N⌋), the floor
  `stethoscope_breaker_min_isolations` (default 1);
- all nodes out of service, its own and the others Slurm shows DRAIN or DOWN (a human's drain, a
  dead node) ≤ that limit + max(1, ⌊f × N⌋): the others may use up the second share only, so one
  human drain on 16 nodes still leaves room for one isolation, two do not;
- its new isolations within a sliding window ≤ max(floor, ⌊f_window × N⌋).

Past any, a drain is refused (recorded `refused`, alerted) with a reason naming the limit, the counts
and the nodes. Permits are taken under a lock: findings act in parallel. Each cycle gives the breaker
its drains in the plan's order (`admit`), and a drain the order left no room for is refused even when
it asks first: incidents run side by side, yet `--execute` drains the nodes `diagnose --plan` said."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from stethoscope.remediation.ledger import Drain, Ledger
from stethoscope.remediation.slurm_state import SlurmNode

OWN, OUT_OF_SERVICE, WINDOW = "own", "out_of_service", "window"  # the limits' names


def limit(fraction: float, fleet_size: int, floor: int = 1) -> int:
    return max(floor, math.floor(fraction * fleet_size))


@dataclass
class CircuitBreaker:
    fleet_size: int
    fraction: float = 0.10  # of the inventory, for the nodes isolated at once
    window_seconds: int = 3600
    window_fraction: float = 0.10  # new isolations within the window
    min_isolations: int = 1  # the floor of stethoscope's own limits
    own: set[str] = field(default_factory=set)  # stethoscope's isolations now, drains under way included
    others: dict[str, str] = field(default_factory=dict)  # node -> Slurm's reason: out of service, not ours
    recent: set[str] = field(default_factory=set)  # isolated by stethoscope within the window
    slurm_note: str = ""  # "" when Slurm was asked, else why the others are not known
    _reserved: set[str] = field(default_factory=set, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _refused: dict[str, str] = field(default_factory=dict, repr=False)  # this cycle's order: node -> why

    @property
    def allowed(self) -> int:
        return limit(self.fraction, self.fleet_size, self.min_isolations)

    @property
    def allowed_out_of_service(self) -> int:
        return self.allowed + limit(self.fraction, self.fleet_size)

    @property
    def allowed_in_window(self) -> int:
        return limit(self.window_fraction, self.fleet_size, self.min_isolations)

    @property
    def isolated(self) -> set[str]:
        """Every node out of service now: stethoscope's and the others'."""
        return self.own | set(self.others)

    def admit(self, nodes: Sequence[str]) -> dict[str, tuple[bool, str]]:
        """Whether each of `nodes`, drained in this order, would be let through now, and why; `permit`
        refuses those the order left no room for until a later cycle's plan judges them again (a
        drain queued in one cycle may ask in a later one). Reserves nothing."""
        with self._lock:
            trial = replace(
                self,
                own=set(self.own),
                recent=set(self.recent),
                others=dict(self.others),
                _reserved=set(self._reserved),
                _lock=threading.Lock(),
                _refused={},
            )
            verdicts = {node: trial.permit(node) for node in dict.fromkeys(nodes)}
            for node, (allowed, why) in verdicts.items():
                if allowed:
                    self._refused.pop(node, None)
                else:
                    self._refused[node] = why
            return verdicts

    def hold(self, nodes: Sequence[str], why: str) -> None:
        """Refuse the drains of `nodes` this cycle for a reason besides the limits (the next cycle's
        `admit` judges them again)."""
        with self._lock:
            self._refused.update(dict.fromkeys(nodes, why))

    def permit(self, node: str) -> tuple[bool, str]:
        """Reserve an isolation of `node`, or say why not; `release` gives back one that failed."""
        with self._lock:
            if node in self._refused:
                return False, self._refused[node]
            allowed, why = self._room(node)
            if allowed and node not in self.isolated:
                self.own.add(node)
                self.recent.add(node)
                self._reserved.add(node)
            return allowed, why

    def room(self, node: str) -> tuple[bool, str]:
        """Whether `node` could be isolated now, and why not; reserves nothing (`permit` does)."""
        with self._lock:
            if node in self._refused:
                return False, self._refused[node]
            return self._room(node)

    def _room(self, node: str) -> tuple[bool, str]:
        if node in self.isolated:
            return True, f"{node} is already out of service"
        n = self.fleet_size
        if len(self.own) >= self.allowed:
            return False, (
                f"circuit breaker, own limit: {len(self.own)} of {n} nodes isolated now by stethoscope "
                f"({_named(self.own)}), the limit is {self.allowed} ({self.fraction:.0%} of {n}, at "
                f"least {self.min_isolations}); not draining {node}{self.slurm_note}"
            )
        out = self.isolated
        if len(out) >= self.allowed_out_of_service:
            return False, (
                f"circuit breaker, out-of-service limit: {len(out)} of {n} nodes out of service now "
                f"({len(self.own)} by stethoscope: {_named(self.own)}; {len(self.others)} DRAIN or DOWN "
                f"in Slurm by others: {_named(self.others)}), the limit is {self.allowed_out_of_service} "
                f"(own limit {self.allowed} + {limit(self.fraction, n)}); "
                f"not draining {node}{self.slurm_note}"
            )
        # the window counts nodes: isolating again one it already counts adds none (resumed without repair)
        if node not in self.recent and len(self.recent) >= self.allowed_in_window:
            return False, (
                f"circuit breaker, window limit: {len(self.recent)} of {n} nodes newly isolated within "
                f"{self.window_seconds} s ({_named(self.recent)}), the limit is {self.allowed_in_window} "
                f"({self.window_fraction:.0%} of {n}, at least {self.min_isolations}); not draining {node}"
                f"{self.slurm_note}"
            )
        return True, "within the circuit breaker's limits"

    def release(self, node: str) -> None:
        with self._lock:
            if node in self._reserved:
                self._reserved.discard(node)
                self.own.discard(node)
                self.recent.discard(node)

    def settle(self, node: str) -> None:
        """The drain permitted for `node` is on record (the ledger counts it from the next `arm`)."""
        with self._lock:
            self._reserved.discard(node)

    def arm(
        self,
        ledger: Ledger,
        slurm_names: Mapping[str, str],
        slurm: Mapping[str, SlurmNode] | None,
        now_ms: int,
        timeout_ms: int,
        expire: Callable[[Drain], bool] | None = None,
    ) -> None:
        """Who is out of service now, and who stethoscope isolated within the window, from the actions
        table and, where it could be asked (`slurm` not None), Slurm. `slurm_names`: inventory name ->
        Slurm's. An in-flight drain past its timeout counts if `expire` says its drain is in place
        (the executor records the verdict); without `expire` (a read-only look) if Slurm shows it."""
        own = set()
        for drain in ledger.drains():
            overdue = drain.status == "in_flight" and now_ms - drain.started_ms > timeout_ms
            if overdue and not (expire(drain) if expire else drain_in_place(drain, slurm_names, slurm)):
                continue
            own.add(drain.node)
        recent = ledger.isolations_since(now_ms - self.window_seconds * 1000)
        others = {}
        note = "; Slurm could not be asked: nodes drained by others are not counted" if slurm is None else ""
        for name, slurm_name in slurm_names.items():
            node = slurm.get(slurm_name) if slurm is not None else None
            if node is not None and node.out_of_service and name not in own:
                others[name] = node.reason
        # one breaker serves every cycle (and the pool's work queued in each): a drain it permitted
        # whose row the ledger did not show yet still counts until `settle` or `release`
        with self._lock:
            self.own = own | self._reserved
            self.recent = recent | self._reserved
            self.others = {k: v for k, v in others.items() if k not in self._reserved}
            self.slurm_note = note

    def state(self) -> dict[str, Any]:
        """The limits, their floor and what counts against each (`stethoscope breaker`, /metrics)."""
        with self._lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        return {
            "fleet_size": self.fleet_size,
            "slurm": self.slurm_note.lstrip("; ") or "asked",
            "limits": {
                OWN: {
                    "limit": self.allowed,
                    "rule": f"max({self.min_isolations}, floor({self.fraction:g} x {self.fleet_size}))",
                    "count": len(self.own),
                    "nodes": sorted(self.own),
                },
                OUT_OF_SERVICE: {
                    "limit": self.allowed_out_of_service,
                    "rule": f"own limit + max(1, floor({self.fraction:g} x {self.fleet_size}))",
                    "count": len(self.isolated),
                    "nodes": sorted(self.isolated),
                    "others": dict(sorted(self.others.items())),
                },
                WINDOW: {
                    "limit": self.allowed_in_window,
                    "rule": f"max({self.min_isolations}, floor({self.window_fraction:g} x {self.fleet_size}))"
                    f" within {self.window_seconds} s",
                    "count": len(self.recent),
                    "nodes": sorted(self.recent),
                },
            },
        }


def drain_in_place(
    drain: Drain, slurm_names: Mapping[str, str], slurm: Mapping[str, SlurmNode] | None
) -> bool:
    """Whether Slurm shows the drain of this row's transaction on its node."""
    node = slurm.get(slurm_names.get(drain.node, drain.node)) if slurm else None
    return node is not None and node.out_of_service and drain.txn_id in node.reason.split()


def _named(nodes: Any) -> str:
    return ", ".join(sorted(nodes)) or "none"
