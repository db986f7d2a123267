"""The circuit breaker as it stands now (`stethoscope breaker`): its limits with their floor, what
counts against each (stethoscope's own isolations, the nodes Slurm shows out of service for other
reasons, the isolations within the window), and the drains it refused lately with their reasons.
Read-only: an in-flight drain past its timeout is counted as the executor would (if Slurm shows
it), not expired."""

from __future__ import annotations

from typing import Any

from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.ledger import BREAKER_REFUSAL, Ledger
from stethoscope.remediation.retries import REFUSED, reason_of
from stethoscope.remediation.settings import Settings
from stethoscope.remediation.slurm_state import read_nodes
from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms


def armed(store: Store, context: Any) -> CircuitBreaker:
    """The breaker of `context` (remediation.executor.Context) armed now, read-only."""
    settings = Settings.of(context)
    hosts = context.inventory.hosts
    breaker = settings.breaker(len(hosts))
    slurm = read_nodes(context.slurm_environment)
    breaker.arm(Ledger(store), context.slurm_names, slurm, now_ms(), settings.playbook_timeout * 1000)
    return breaker


def breaker_state(store: Store, context: Any, since_ms: int) -> dict[str, Any]:
    """The breaker's state now and its refusals since `since_ms` (newest first), of the inventory's
    nodes only: another inventory's executor may share the store."""
    state = armed(store, context).state()
    hosts = context.inventory.hosts
    # a refusal's own row where there is one (a drain's row changes when it is tried again); a drain
    # row still refused from before those rows were kept
    states = Ledger(store).action_states(status=REFUSED, since_ms=since_ms)
    kept = {(s.txn_id, s.target) for s in states if s.action == BREAKER_REFUSAL}
    refused = [
        s
        for s in states
        if s.target in hosts and (s.action == BREAKER_REFUSAL or (s.txn_id, s.target) not in kept)
    ]
    state["refusals"] = [
        {
            "at": iso(s.started_ms),
            "node": s.target,
            "action": s.action,
            "txn_id": s.txn_id,
            "reason": reason_of(s.detail) or "no reason recorded",
        }
        for s in reversed(refused)
    ]
    return state
