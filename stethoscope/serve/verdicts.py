"""The per-node verdicts serve publishes each cycle for the Slurm gate (telemetry.gate): GET /gate/<node>
answers the node's last verdict, signed with its own key, HMAC(cluster secret, node_id). Only the
nodes of the keyring (a `stethoscope_node_key` in the inventory) have a key, so only they have a
verdict. A cycle that fails publishes nothing: the last verdicts age, and the gates call them stale
once their grace has passed (a symptom the gate says, never a drain).

The executor's safety rules hold for the gate too: each verdict carries serve's mode (a dry-run
serve's failures are advisory: the gate drains nothing), and no more nodes fail than the circuit
breaker has room for: the nodes already out of service, and at most as many others (in name order) as
the tightest of the breaker's limits has spare; the rest are ok, "held back by the circuit breaker"."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.breaker_state import armed
from stethoscope.remediation.cycle import Cycles
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.telemetry import gate, wire
from stethoscope.telemetry.keyring import Keyring

STALE_CYCLES = 3  # a verdict counts for this many intervals, and a minute more, after its cycle
STALE_SLACK = 60.0


def default_grace(interval: float) -> float:
    return STALE_CYCLES * interval + STALE_SLACK


@dataclass(frozen=True)
class Room:
    """What the circuit breaker allows the gates: `isolated`, the nodes out of service now (they may
    fail); `admit`, whether one more node may, reserving it (None: no cap, a dry-run serve whose
    failures are advisory)."""

    isolated: frozenset[str] = field(default_factory=frozenset)
    admit: Callable[[str], tuple[bool, str]] | None = None


def room_of(breaker: CircuitBreaker) -> Room:
    """The room of a breaker armed for this look alone (its permits are reserved in it, never in the
    executor's): the nodes out of service now may fail (they take no further isolation), and others
    as its three limits allow, the window's counting a node it already counts once (as a drain)."""
    return Room(frozenset(breaker.isolated), breaker.permit)


def room_for(store: Store, cycles: Cycles) -> Room:
    """The breaker's room as serve's executor sees it now (remediation.breaker_state.armed); no cap for
    a dry-run serve. A breaker that cannot be armed allows no new failure: the gates drain no more
    than the executor could."""
    if cycles.execute_with is None:
        return Room()
    try:
        return room_of(armed(store, cycles.execute_with(store.dsn, store.database)))
    except Exception as exc:
        unknown = f"its state not known ({type(exc).__name__}: {redact(str(exc))})"
        return Room(frozenset(), lambda _node: (False, unknown))


def capped(verdicts: dict[str, dict], room: Room) -> dict[str, dict]:
    """`verdicts` with the failures the breaker has no room for held back (in name order)."""
    if room.admit is None:
        return verdicts
    out = {}
    for node in sorted(verdicts):
        verdict = verdicts[node]
        if verdict["verdict"] == gate.FAIL and node not in room.isolated:
            allowed, why = room.admit(node)
            if not allowed:
                verdict = gate.hold_back(verdict, why)
        out[node] = verdict
    return out


class Verdicts:
    def __init__(self, keyring: Keyring, grace: float):
        self.grace = grace
        self._keys = {
            node: [wire.node_secret(secret, node) for secret in keyring.secrets]
            for node in keyring.nodes.values()
        }
        self._bodies: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def publish(self, findings: list[dict], at_ms: int, executing: bool, room: Room) -> None:
        """Each keyed node's verdict of the findings of the cycle that evaluated at `at_ms`, in serve's
        mode (`executing`: --execute), its failures capped at the breaker's `room`."""
        now = time.time()
        mode = gate.ENFORCING if executing else gate.ADVISORY
        made = {
            node: gate.verdict_of(node, findings, now, self.grace, at_ms / 1000, mode) for node in self._keys
        }
        bodies = {node: gate.sign(self._keys[node], verdict) for node, verdict in capped(made, room).items()}
        with self._lock:
            self._bodies = bodies

    def answer(self, node: str) -> tuple[int, bytes]:
        """(HTTP status, body) for GET /gate/<node>."""
        if node not in self._keys:
            return 404, f"no verdict for {node}: no stethoscope_node_key in serve's inventory\n".encode()
        with self._lock:
            body = self._bodies.get(node)
        if body is None:
            return 503, b"no verdict yet: the first cycle has not finished\n"
        return 200, body
