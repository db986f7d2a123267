"""Actions left `in_flight` by an executor that died (docs/design.md "Remediation safety"): found at
the start of every cycle that acts, and settled before the cycle decides what to do.

An in-flight row names the executor that started it (`detail.executor`: host and pid). It is an
orphan when that executor is gone: on this host its pid is dead (a SIGKILLed serve: the kernel
freed its flock and its successor holds it now), on another its heartbeat stopped (3 missed beats);
a row naming no executor (an older version's) when it is older than its action's timeout. This
executor's own rows are never orphans while their incident's work runs.

- A drain: Slurm is read back; its txn's reason in place -> recorded `ok`; not in place (or Slurm
  cannot be asked) -> `expired`, due now, so the cycle's retries drain it again (the slurm_node
  module changes nothing when the reason is in place) and the breaker counts it as stethoscope's.
- Evidence, ticket, alert, api_call, log -> `expired`, due now: run again in this cycle. They are
  idempotent by txn: the bundle is rewritten under its txn, the Jira ticket role searches the txn's
  label before it opens an issue (and comments on the one it finds), HTTP calls carry the txn as
  their Idempotency-Key.
- The actions of the orphan's finding that come after it in its plan and have no row in the
  incident never started: they are handed back to run now, in order.
- A `planned` row (written for every action before any is queued) whose executor is gone never
  started: handed back to run now too, so that a crash before an incident's first action, or
  between two of its steps, loses nothing.

Each settled row says "reconciled after a crash: ..." in its detail (the retry's history keeps it).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from stethoscope.diagnosis.levels import action_label
from stethoscope.diagnosis.rules import Action
from stethoscope.remediation.ledger import BOOKKEEPING, DRAIN, ActionState, Ledger
from stethoscope.remediation.lock import PROCESS_STARTED_MS
from stethoscope.remediation.slurm_state import SlurmNode
from stethoscope.store.holder import pid_alive
from stethoscope.timeutil import iso, now_ms

RECONCILED = "reconciled after a crash"
PLANNED = "planned"  # an action decided and queued, not started: its row names its executor too
OWNER = "executor"  # the key of an in-flight row's detail that names its executor


def owner() -> dict[str, Any]:
    """What an in-flight row records of the executor that started it: host, pid and the process's
    start (a serve restarted in one container has pid 1 again: the start tells it from its predecessor)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": PROCESS_STARTED_MS}


@dataclass(frozen=True)
class Orphans:
    """How to tell an orphan: this executor (its host, pid and start), the executors whose heartbeat
    is live (None: not known, e.g. an executor run without its cycle), and each action's timeout."""

    live: Collection[tuple[str, int, int]] | None
    timeout_ms: Callable[[str], int]
    busy: Collection[str] = ()  # transactions this executor's own actions are running for
    me: tuple[str, int, int] = field(
        default_factory=lambda: (socket.gethostname(), os.getpid(), PROCESS_STARTED_MS)
    )

    def orphaned(self, state: ActionState, now: int) -> bool:
        started = state.detail.get(OWNER)
        if isinstance(started, dict) and "host" in started and "pid" in started:
            named = (str(started["host"]), _pid(started["pid"]))
            # an older version's row names no start: told apart by host and pid alone
            start = _pid(started["started"]) if "started" in started else None
            if named != self.me[:2] or start not in (None, self.me[2]):
                # on this host: its pid is dead, or it is this process's pid with another start
                gone = named[0] == self.me[0] and (named[1] == self.me[1] or not pid_alive(named[1]))
                if self.live is None:
                    return gone
                live = {w[:2] for w in self.live} if start is None else set(self.live)
                return gone or (named if start is None else (*named, start)) not in live
        if state.txn_id in self.busy:
            return False
        return now - state.started_ms > self.timeout_ms(state.action)


def _pid(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


@dataclass
class Reconciled:
    """What a reconciliation settled: (row, its new status) each; and the actions that never started,
    per finding id, to run now."""

    settled: list[tuple[ActionState, str]] = field(default_factory=list)
    unstarted: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # finding -> (txn, labels)


def reconcile(
    ledger: Ledger,
    orphans: Orphans,
    at_ms: int,
    slurm_names: Mapping[str, str],
    read_slurm: Callable[[], Mapping[str, SlurmNode] | None],
    plans: Callable[[str], tuple[Action, ...] | None],
) -> Reconciled:
    """Settle the orphaned in-flight rows (module docstring). `plans(finding_id)`: the plan of a
    finding, None when it is not known; `read_slurm` is asked once, only if a drain is orphaned."""
    now = now_ms()
    found = [s for s in ledger.action_states(status="in_flight") if orphans.orphaned(s, now)]
    done = Reconciled()
    for state in ledger.action_states(status=PLANNED):  # its executor died before it started
        if orphans.orphaned(state, now) and state.finding_id:
            _, labels = done.unstarted.setdefault(state.finding_id, (state.txn_id, []))
            labels.append(state.action)
    if not found:
        return done
    slurm = read_slurm() if any(s.action == DRAIN for s in found) else None
    taken: dict[str, set[str]] = {}
    for state in ledger.action_states({s.txn_id for s in found}):
        if state.status != PLANNED:
            taken.setdefault(state.txn_id, set()).add(state.action)
    for state in found:
        status, why = _verdict(state, slurm_names, slurm)
        detail = {k: v for k, v in state.detail.items() if k != OWNER}
        detail["reason"] = f"{RECONCILED}: {why}"
        if status == "expired":
            detail["next_retry_at"] = iso(at_ms)  # due in this cycle
        row = {
            "txn_id": state.txn_id,
            "finding_id": state.finding_id,
            "action": state.action,
            "target": state.target,
            "status": status,
            "detail": detail,
            "started_at": state.started_ms,
            "finished_at": now,
        }
        ledger.write_action(row, max(now_ms(), state.version + 1))
        done.settled.append((state, status))
        plan = plans(state.finding_id) if state.finding_id and state.action not in BOOKKEEPING else None
        labels = [action_label(a) for a in plan or ()]
        if state.action in labels:
            after = labels[labels.index(state.action) + 1 :]
            missing = [label for label in after if label not in taken.get(state.txn_id, set())]
            if missing:
                _, already = done.unstarted.setdefault(state.finding_id, (state.txn_id, []))
                already.extend(label for label in missing if label not in already)
    return done


def _verdict(
    state: ActionState, slurm_names: Mapping[str, str], slurm: Mapping[str, SlurmNode] | None
) -> tuple[str, str]:
    if state.action != DRAIN:
        return "expired", "it may not have finished; run again now (idempotent by its txn)"
    if slurm is None:
        return "expired", "Slurm could not be asked; drained again now (a drain in place is left as it is)"
    node = slurm.get(slurm_names.get(state.target, state.target))
    if node is not None and node.out_of_service and state.txn_id in node.reason.split():
        return "ok", "Slurm shows its drain"
    return "expired", "Slurm shows no drain of its txn; drained again now"
