"""An acknowledged incident (`stethoscope incidents ack|unack`): a person took it. Its retries and
alerts wait until it escalates (a more severe finding joins it: an `escalate` row after the ack) or
it is un-acknowledged (the ack row again, status `withdrawn`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from stethoscope.remediation.ledger import ACK, ESCALATE, ActionState

WITHDRAWN = "withdrawn"


@dataclass(frozen=True)
class Acknowledgement:
    by: str
    note: str
    at_ms: int
    escalated: bool  # a more severe finding joined since: the pause is over

    @property
    def pausing(self) -> bool:
        return not self.escalated

    def describe(self) -> str:
        if self.escalated:  # the incident reads `open`: the pause is over
            return f"open again: escalated after {self.by} acknowledged it"
        return f"acknowledged by {self.by}"


def acknowledgement(states: Iterable[ActionState]) -> Acknowledgement | None:
    """The standing acknowledgement of one incident (its latest ack row, not withdrawn), or None."""
    chosen = list(states)
    acks = [s for s in chosen if s.action == ACK]
    if not acks:
        return None
    latest = max(acks, key=lambda s: s.version)
    if latest.status != "ok":
        return None
    escalated = any(s.action == ESCALATE and s.started_ms > latest.started_ms for s in chosen)
    detail = latest.detail
    return Acknowledgement(
        str(detail.get("by", "?")), str(detail.get("note", "")), latest.started_ms, escalated
    )


def paused_txns(states: Iterable[ActionState]) -> set[str]:
    """The transactions whose retries and alerts wait for the person who acknowledged them."""
    by_txn: dict[str, list[ActionState]] = {}
    for state in states:
        by_txn.setdefault(state.txn_id, []).append(state)
    return {txn for txn, group in by_txn.items() if (ack := acknowledgement(group)) and ack.pausing}
