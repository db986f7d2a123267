"""What an incident is now, for people: `stethoscope incidents` and `actions`, and the note each
finding's outcome line carries. An incident is a transaction: its findings (the findings table, the
latest row of each) and its actions (the actions table, the latest row of each action)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from stethoscope.catalog import Catalog, default_catalog
from stethoscope.diagnosis.levels import SEVERITY_ORDER
from stethoscope.remediation.ack import WITHDRAWN, Acknowledgement, acknowledgement
from stethoscope.remediation.incidents import enclosing_device, keeps_own
from stethoscope.remediation.ledger import ACK, NEEDS_PERSON, ActionState, KnownFinding, Ledger, note_row
from stethoscope.remediation.retries import Backoff, exhausted, pending, retryable
from stethoscope.remediation.silences import SILENCED
from stethoscope.store.client import Store
from stethoscope.timeutil import iso

OPEN, NEEDS, ACKNOWLEDGED, RESOLVED = "open", "needs a person", "acknowledged", "resolved"


@dataclass
class Incident:
    txn_id: str
    node_id: str
    device: str  # the enclosing device of its findings; "" node-level
    severity: str  # its worst finding's
    rules: list[str]
    first_seen_ms: int
    last_seen_ms: int
    status: str  # open | needs a person | acknowledged | silenced | resolved
    findings: list[KnownFinding] = field(default_factory=list)
    actions: list[ActionState] = field(default_factory=list)

    @property
    def ack(self) -> Acknowledgement | None:
        return acknowledgement(self.actions)

    def as_dict(self) -> dict[str, Any]:
        ack = self.ack
        return {
            "acknowledged_by": ack.by if ack else None,
            "txn_id": self.txn_id,
            "node_id": self.node_id,
            "device": self.device,
            "severity": self.severity,
            "status": self.status,
            "rules": self.rules,
            "first_seen": iso(self.first_seen_ms),
            "last_seen": iso(self.last_seen_ms),
        }


def status_of(findings: Collection[KnownFinding], states: Collection[ActionState]) -> str:
    if all(f.status == "resolved" for f in findings):
        return RESOLVED
    if all(f.status in ("resolved", SILENCED) for f in findings):
        return SILENCED  # a silence or maintenance holds what is left of it
    ack = acknowledgement(states)
    if ack is not None and ack.pausing:
        return ACKNOWLEDGED
    if any(s.action == NEEDS_PERSON for s in states):
        return NEEDS
    return OPEN


def notes(
    states: list[ActionState], backoff: Backoff, attempted: Collection[tuple[str, str, str]] = ()
) -> dict[str, list[str]]:
    """Per transaction, what its incident waits for: a person, a retry and when (not of the actions
    `attempted` this cycle: their outcome says it), and who acknowledged it."""
    said: dict[str, list[str]] = {}
    for state in states:
        if state.action == NEEDS_PERSON:
            note = f"needs a person: {state.detail.get('reason', '')}"
        elif state.action == ACK:
            ack = acknowledgement(s for s in states if s.txn_id == state.txn_id)
            if ack is None:
                continue
            note = ack.describe() + ("" if ack.escalated else ": its retries and alerts wait")
        elif (
            retryable(state)
            and not exhausted(state, backoff)
            and (state.txn_id, state.finding_id, state.action) not in attempted
        ):
            note = pending(state, backoff)
        else:
            continue
        said.setdefault(state.txn_id, []).append(note)
    return said


def _device(catalog: Catalog, findings: list[KnownFinding]) -> str:
    for f in findings:
        if f.device:
            return f.device if keeps_own(f.rule_id, f.node_id) else enclosing_device(catalog, f.device)
    return ""


def _incident(
    txn: str, findings: list[KnownFinding], states: list[ActionState], catalog: Catalog
) -> Incident:
    worst = max(findings, key=lambda f: SEVERITY_ORDER.get(f.severity, 0))
    return Incident(
        txn,
        findings[0].node_id,
        _device(catalog, findings),
        worst.severity,
        sorted({f.rule_id for f in findings}),
        min(f.first_seen_ms for f in findings),
        max(f.last_seen_ms for f in findings),
        status_of(findings, states),
        sorted(findings, key=lambda f: (-SEVERITY_ORDER.get(f.severity, 0), f.first_seen_ms, f.rule_id)),
        states,
    )


def incidents(
    store: Store, include_resolved: bool = False, node: str | None = None, catalog: Catalog | None = None
) -> list[Incident]:
    """The incidents (not resolved ones unless `include_resolved`), the worst and latest first."""
    ledger = Ledger(store)
    by_txn: dict[str, list[KnownFinding]] = {}
    for known in ledger.known_findings().values():
        if known.txn_id:
            by_txn.setdefault(known.txn_id, []).append(known)
    chosen = {
        txn: members
        for txn, members in by_txn.items()
        if (include_resolved or any(m.status != "resolved" for m in members))
        and (node is None or any(m.node_id == node or node in m.nodes for m in members))
    }
    states: dict[str, list[ActionState]] = {}
    for state in ledger.action_states(chosen) if chosen else []:
        states.setdefault(state.txn_id, []).append(state)
    found = [_incident(t, m, states.get(t, []), catalog or default_catalog()) for t, m in chosen.items()]
    found.sort(key=listing_order)
    return found


def listing_order(found: Incident) -> tuple:
    """Open before resolved, worst and latest first; ties (seen at the same instant) in a fixed order,
    so that a listing is the same every time."""
    return (
        found.status == RESOLVED,
        -SEVERITY_ORDER.get(found.severity, 0),
        -found.last_seen_ms,
        found.node_id,
        found.device or "",
        found.txn_id,
        ", ".join(found.rules),
    )


def incident(store: Store, txn_id: str, catalog: Catalog | None = None) -> Incident | None:
    ledger = Ledger(store)
    members = [k for k in ledger.known_findings().values() if k.txn_id == txn_id]
    states = ledger.action_states([txn_id])
    if not members:
        return None
    return _incident(txn_id, members, states, catalog or default_catalog())


def acknowledge(store: Store, found: Incident, by: str, note: str) -> dict[str, Any]:
    """Record that a person took the incident: an `ack` row of its transaction (a later one replaces
    it). Its retries and alerts wait (remediation.ack) and its status reads `acknowledged` until it
    escalates, is un-acknowledged or resolves."""
    row = note_row(found.txn_id, ACK, found.node_id, {"by": by, "note": note})
    Ledger(store).write_action(row, row["finished_at"])
    return row


def unacknowledge(store: Store, found: Incident, by: str) -> dict[str, Any]:
    """The incident's ack row again, `withdrawn`: its retries and alerts go on."""
    earlier = found.ack
    detail = {"by": earlier.by if earlier else "", "withdrawn_by": by}
    row = {**note_row(found.txn_id, ACK, found.node_id, detail), "status": WITHDRAWN}
    version = max([row["finished_at"], *(s.version + 1 for s in found.actions if s.action == ACK)])
    Ledger(store).write_action(row, version)
    return row
