"""Retries of failed actions (docs/design.md "Rules"): an action of an open incident that failed (a
playbook's rc, an HTTP failure) or expired runs again on a later cycle after a backoff (5, 15, 45 min
by default: `stethoscope_action_retries`, `stethoscope_action_backoff`, each wait 3 times the one
before); past the last retry its incident needs a person. A drain the circuit breaker refused did not
run: the refusal is no attempt, and the drain is tried again at every cycle the breaker has room
(the executor asks it first). A drain is retried only while a finding of its incident matches
(remediation/life.py), the other actions while the incident is open. A row recorded before
`next_retry_at` was is due its first backoff after it started. A skipped action (nothing configured
to act with) is never retried.

The actions table keeps one row per (txn, finding, action, target) once ClickHouse merges its
versions, so an action's row carries its own attempts: `attempt`, `of` and, while one is due,
`next_retry_at` in its detail, and the attempts before it in `history`; no merge loses one.
Retries run on the cycle's clock (the evaluation time), as the finding's life does."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from stethoscope.diagnosis.rules import parse_duration
from stethoscope.remediation.ledger import BOOKKEEPING, DRAIN, ActionState
from stethoscope.store.dsn import ConfigError
from stethoscope.timeutil import iso, to_ms

RETRIED = ("failed", "refused", "expired")
ATTEMPTED = ("failed", "expired")  # of those, the ones that ran: they count, and wait for a backoff
REFUSED = "refused"  # nothing ran: tried again when the breaker has room, whatever the time


@dataclass(frozen=True)
class Backoff:
    retries: int = 3
    base_seconds: int = 300
    factor: int = 3

    @classmethod
    def from_settings(cls, setting: Any) -> Backoff:
        """From `stethoscope_action_retries` and `stethoscope_action_backoff` (a duration such as 5m,
        or seconds); ConfigError (exit 2) on anything else."""
        retries, backoff = (
            setting("stethoscope_action_retries", 3),
            setting("stethoscope_action_backoff", "5m"),
        )
        seconds = duration_setting(backoff)
        if not str(retries).isdigit() or not seconds:
            raise ConfigError(
                "stethoscope_action_retries must be a whole number (0 or more) and "
                f"stethoscope_action_backoff a duration such as 5m; got {retries!r}, {backoff!r}"
            )
        return cls(int(retries), seconds)

    @property
    def attempts(self) -> int:
        return self.retries + 1

    def delay_ms(self, attempt: int) -> int:
        """The wait after attempt `attempt` (1-based) failed."""
        return self.base_seconds * 1000 * self.factor ** (attempt - 1)


def duration_setting(value: Any) -> int | None:
    """A setting that is a duration: 5m, 1h, or whole seconds (`-e name=300` gives the text "300");
    None if it is neither."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value > 0 else None
    return parse_duration(value)


def attempt_of(detail: dict[str, Any]) -> int:
    try:
        return max(1, int(detail.get("attempt", 1)))
    except (TypeError, ValueError):
        return 1


def next_retry_ms(detail: dict[str, Any]) -> int | None:
    when = detail.get("next_retry_at")
    try:
        return to_ms(when) if when else None
    except ValueError:
        return None


def reason_of(detail: dict[str, Any]) -> str:
    """Why an action ended as it did, in a line: its reason, error, HTTP status, rc, failed task."""
    parts = [str(detail[key]) for key in ("reason", "error") if detail.get(key)]
    if detail.get("by"):  # an acknowledgement
        parts.append(f"by {detail['by']}" + (f": {detail['note']}" if detail.get("note") else ""))
    status = detail.get("http_status")
    if status is not None and not 200 <= int(status) < 400:
        parts.append(f"HTTP {status}")
    elif status is None and detail.get("response"):
        parts.append(str(detail["response"])[:200])
    if detail.get("rc") not in (None, 0):
        parts.append(f"rc {detail['rc']} ({detail.get('runner_status', '')})".replace(" ()", ""))
        failed = [e for e in detail.get("events") or () if e.get("event") != "runner_on_ok"]
        parts += [f"{e.get('task')}: {e.get('msg')}".rstrip(": ") for e in failed[:1]]
    return "; ".join(parts)


def next_attempt(earlier: ActionState | None) -> int:
    """The number of the attempt after `earlier`: a refusal ran nothing, so its number is tried again."""
    if earlier is None:
        return 1
    return attempt_of(earlier.detail) + (0 if earlier.status == REFUSED else 1)


def attempt_detail(
    result: Any, status: str, attempt: int, at_ms: int, backoff: Backoff, earlier: ActionState | None
) -> dict[str, Any]:
    """The detail of attempt `attempt` (`status` "in_flight" while it runs): the action's own result,
    the attempt, when the next is due if it failed and one is left, and the attempts before it."""
    detail = dict(result) if isinstance(result, dict) else ({"detail": result} if result else {})
    detail.update(attempt=attempt, of=backoff.attempts, tried_at=iso(at_ms))
    if earlier is not None:
        before = earlier.detail.get("history") or []
        detail["history"] = [*before, _summary(earlier)]
    if status in ATTEMPTED and attempt < backoff.attempts:
        detail["next_retry_at"] = iso(at_ms + backoff.delay_ms(attempt))
    return detail


def _summary(state: ActionState) -> dict[str, Any]:
    return {
        "attempt": attempt_of(state.detail),
        "status": state.status,
        "at": iso(state.started_ms),
        "why": reason_of(state.detail),
    }


def exhausted(state: ActionState, backoff: Backoff) -> bool:
    """Failed (or expired) at its last attempt; a refused action never is: it did not run."""
    return state.status in ATTEMPTED and attempt_of(state.detail) >= backoff.attempts


def retryable(state: ActionState) -> bool:
    return state.status in RETRIED and state.action not in BOOKKEEPING


def due_at(state: ActionState, backoff: Backoff) -> int | None:
    """When the next attempt of a failed or expired action is due (ms): its `next_retry_at`, else (a
    row recorded before retries) its first backoff after it started; None for a refused one (due
    at every cycle, the breaker permitting)."""
    if state.status == REFUSED:
        return None
    when = next_retry_ms(state.detail)
    return when if when is not None else state.started_ms + backoff.delay_ms(1)


def due(states: list[ActionState], at_ms: int, backoff: Backoff) -> list[ActionState]:
    """The actions whose next attempt is due at `at_ms`: failed and expired ones past their backoff,
    refused ones at once (whether the breaker has room now is the executor's to ask)."""
    found = []
    for state in states:
        if not retryable(state) or exhausted(state, backoff):
            continue
        when = due_at(state, backoff)
        if when is None or when <= at_ms:
            found.append(state)
    return found


def pending(state: ActionState, backoff: Backoff) -> str:
    """What an action waiting for its retry says in the cycle's outcome line; a drain is retried only
    while a finding of its incident matches (remediation/life.py)."""
    attempt = attempt_of(state.detail)
    matching = " while a finding of the incident matches" if state.action == DRAIN else ""
    if state.status == REFUSED:
        return (
            f"{state.action} refused, attempt {attempt} of {backoff.attempts} runs when the circuit "
            f"breaker has room{matching}"
        )
    at = iso(due_at(state, backoff) or state.started_ms)
    return f"{state.action} {state.status}, retry {attempt} of {backoff.retries} at {at}{matching}"
