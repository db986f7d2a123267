"""`diagnose --execute`: findings become incidents (transactions) and their actions run, each recorded.

What acts is decided by the finding's life (remediation/life.py): a new finding opens an incident or
joins an open one and runs what the incident has not done yet, one that stays open acts no more,
and the failed actions of open incidents are retried after their backoff (remediation/retries.py);
past the last retry the incident needs a person: recorded and alerted once. Each action's intent is
recorded (`in_flight`) before it starts and its outcome, from ansible-runner's events, after.
Incidents act in parallel (`stethoscope_executor_parallel`, default 4), one incident's steps in order.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.diagnosis.findings import held_finding, template_context
from stethoscope.diagnosis.hysteresis import Held
from stethoscope.diagnosis.levels import action_label
from stethoscope.diagnosis.rules import Action, Rule
from stethoscope.remediation.ack import paused_txns
from stethoscope.remediation.action_events import ActionEvent, emit, publish_breaker, ticket_key
from stethoscope.remediation.action_pool import ActionPool
from stethoscope.remediation.actions.means import Act
from stethoscope.remediation.actions.notify import send_alert
from stethoscope.remediation.actions.registry import handler
from stethoscope.remediation.breaker import CircuitBreaker, drain_in_place
from stethoscope.remediation.context import Context
from stethoscope.remediation.incident_view import notes
from stethoscope.remediation.ledger import (
    BREAKER_REFUSAL,
    DRAIN,
    ESCALATE,
    NEEDS_PERSON,
    REBASELINE,
    VERIFY,
    ActionState,
    Drain,
    KnownFinding,
    Ledger,
    action_row,
    note_row,
)
from stethoscope.remediation.life import PER_FINDING, UPDATES, Decision, Plan, Retry, decide, new_txn_id
from stethoscope.remediation.rebaseline import Due, Upkeep
from stethoscope.remediation.reconcile import OWNER, PLANNED, RECONCILED, Orphans, owner, reconcile
from stethoscope.remediation.retries import (
    ATTEMPTED,
    REFUSED,
    attempt_detail,
    attempt_of,
    next_attempt,
    reason_of,
)
from stethoscope.remediation.settings import Settings
from stethoscope.remediation.silence_table import drains_held, silencer
from stethoscope.remediation.slurm_state import read_nodes
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import redact
from stethoscope.store.spool import Spool
from stethoscope.templating import TemplateFailure
from stethoscope.timeutil import iso, now_ms

__all__ = ["Context", "Executor", "Settings", "new_txn_id"]
_RECORDS = threading.Lock()  # one store handle at a time in this process (embedded), every executor's


@dataclass
class Outcome:
    label: str
    status: str
    attempt: int
    detail: dict[str, Any]


@dataclass
class _Work:
    """One incident's part of a cycle, run in order: its retries, then its new findings' actions."""

    txn_id: str
    retries: list[Retry] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    # past their last retry before this cycle, with their findings
    exhausted: list[tuple[dict[str, Any], ActionState]] = field(default_factory=list)
    asked: bool = False  # the incident is already marked as needing a person


def _work(plan: Plan) -> list[_Work]:
    works: dict[str, _Work] = {}
    for retry in plan.retries:
        works.setdefault(retry.earlier.txn_id, _Work(retry.earlier.txn_id)).retries.append(retry)
    for decision in plan.decisions:
        txn = decision.finding["txn_id"]
        works.setdefault(txn, _Work(txn)).decisions.append(decision)
    asked = {s.txn_id for s in plan.states if s.action == NEEDS_PERSON}
    for txn, states in plan.exhausted.items():
        if txn not in asked:
            works.setdefault(txn, _Work(txn)).exhausted = states
    for work in works.values():
        work.asked = work.txn_id in asked
    return list(works.values())


def _beside(work: _Work, planned: frozenset[str] | None) -> set[str] | None:
    """The actions `work` plans, run beside (after) its incident's earlier work still running, which
    planned `planned` (None: none runs): retries and calls for a person wait for the next cycle, a
    new finding runs only what the running work does not (its log, and a ticket update when it
    escalates). None when nothing is left to run."""
    if planned is not None:
        work.retries, work.exhausted = [], []
        for decision in work.decisions:
            rises = decision.escalation is not None
            decision.actions = tuple(
                a
                for a in decision.actions
                if action_label(a) not in planned
                or action_label(a) in PER_FINDING
                or (rises and action_label(a) in UPDATES)
            )
        work.decisions = [d for d in work.decisions if d.actions or d.escalation]
    labels = {r.earlier.action for r in work.retries}
    for decision in work.decisions:
        labels.update(action_label(a) for a in decision.actions)
        under_way = ", ".join(action_label(a) for a in decision.actions) or "nothing new"
        decision.finding["outcome"] = f"acting in the background: {under_way}"
    if planned is not None and not work.decisions:
        return None
    return labels if work.retries or work.decisions or work.exhausted else None


class _Shaped:
    """Findings shaped for their actions, by id: as matched this cycle, else as stored (read once)."""

    def __init__(self, ledger: Ledger, findings: list[dict[str, Any]], rules: list[Rule]):
        self.ledger, self.rules = ledger, rules
        self.matched = {f["finding_id"]: f for f in findings}
        self._known: dict[str, KnownFinding] | None = None

    def finding(self, finding_id: str) -> dict[str, Any] | None:
        if finding_id in self.matched:
            return self.matched[finding_id]
        if self._known is None:
            self._known = self.ledger.known_findings()
        known = self._known.get(finding_id)
        return held_finding(Held(known.previous(), ""), self.rules) if known else None

    def plan(self, finding_id: str) -> tuple[Action, ...] | None:
        finding = self.finding(finding_id)
        return tuple(finding["plan"]) if finding else None

    def rule_of(self, finding_id: str) -> str:
        finding = self.finding(finding_id) if finding_id else None
        return finding["rule_id"] if finding else ""

    def decisions(self, unstarted: dict[str, tuple[str, list[str]]], paused: set[str]) -> list[Decision]:
        """What a dead executor never started, but not for a finding a silence holds now nor for an
        incident a person acknowledged (`paused`): those wait as their retries do."""
        found = []
        for finding_id, (txn_id, labels) in unstarted.items():
            finding = self.finding(finding_id)
            if finding is None or finding.get("silenced") or txn_id in paused:
                continue
            finding = {**finding, "txn_id": txn_id} if finding.get("txn_id") != txn_id else finding
            actions = tuple(a for a in finding["plan"] if action_label(a) in labels)
            found.append(Decision(finding, actions, joined=""))
        return found


class Executor:
    def __init__(self, context: Context, breaker: CircuitBreaker | None = None):
        """`breaker`: the long-running command's own, kept from cycle to cycle (its pool's work
        queued in one cycle takes its permits in a later one); else one for this run."""
        self.ctx = context
        settings = Settings.of(context)
        self.breaker = breaker or settings.breaker(len(context.inventory.hosts))
        self.http_timeout, self.http_retries = settings.http_timeout, settings.http_retries
        self.playbook_timeout = settings.playbook_timeout
        self.rebaseline_timeout = settings.rebaseline_timeout
        self.parallel = settings.parallel
        self.log_path = Path(context.setting("stethoscope_diagnose_log", context.state_dir / "findings.log"))
        self.backoff = settings.backoff
        self.window_ms = settings.window_ms
        self.at_ms = now_ms()  # the cycle's clock (its evaluation time): retries are due by it
        self.spooled = False
        self._records = _RECORDS
        self._said = threading.Lock()  # the pool's threads add to these while the cycle reads them
        self._attempted: set[tuple[str, str, str]] = set()  # (txn, finding, action) tried this cycle
        self._retried: dict[str, list[str]] = {}  # txn -> what its retries did this cycle

    def _store(self) -> Store:
        return Store(self.ctx.dsn, self.ctx.database)

    def run(
        self,
        findings: list[dict[str, Any]],
        rules: list[Rule],
        at_ms: int,
        model_nodes: Collection[str] | None = None,
        *,
        live: Collection[tuple[str, int, int]] | None = None,
        pool: ActionPool | None = None,
    ) -> list[dict[str, Any]]:
        """The findings with what each did, and the findings held open though they did not match
        (diagnosis.hysteresis). `rules` as fitted to the cadence; `model_nodes`: the nodes the model
        evaluated this cycle (None: it did not run). First, what dead executors left in flight is
        reconciled (remediation.reconcile; `live`: the executors whose heartbeat is live, None when
        not known). With `pool` (serve) the actions run there and this returns at once; an incident
        whose earlier work is still running is not given the same actions again."""
        self.at_ms = at_ms
        busy = pool.busy() if pool is not None else {}
        with self._store() as store:
            self._replay_spool(store)
            ledger = Ledger(store)
            shaped = _Shaped(ledger, findings, rules)
            unstarted = self._reconcile(ledger, live, busy, shaped)
            plan = decide(
                store,
                findings,
                rules,
                at_ms,
                self.ctx.inventory.hosts,
                model_nodes=model_nodes,
                window_ms=self.window_ms,
                backoff=self.backoff,
                quiet=silencer(store, self.ctx),  # a silenced node's incident retries nothing
            )
            ledger.write_findings(plan.rows)
            for finding_id, status, version in plan.changes:
                ledger.set_status(finding_id, status, version)
            plan.decisions += shaped.decisions(unstarted, paused_txns(plan.states))
            acting = [a for d in plan.decisions for a in d.actions] + [r.action for r in plan.retries]
            # armed every cycle (/metrics shows it); overdue drains expire only when one is planned
            self._arm_breaker(ledger, expire=any(action_label(a) == DRAIN for a in acting))
            self.breaker.admit(plan.drains())  # side by side, the drains get room in the plan's order
            held = drains_held(self.ctx)
            if held:
                self.breaker.hold(plan.drains(), held)
            upkeep = Upkeep(
                self.ctx,
                self.breaker,
                self._record,
                self.playbook_timeout,
                self._orphans(live, busy),
                self.rebaseline_timeout,
            )
            # a cycle that drains for a fault (or holds its drains) starts no re-baseline: the
            # breaker's room is the fault's first
            try:
                due = upkeep.plan(store, findings, at_ms, batches=not plan.drains() and not held)
            except StoreError as exc:  # the incidents' own work goes on; the next cycle plans again
                print(f"stethoscope: re-baselines and verifies not planned: {exc}", file=sys.stderr)
                due = Due([], [])
        if pool is None:
            works = _work(plan)
            self._plan_rows(works)
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="incident") as threads:
                list(threads.map(self._incident, works))
        else:
            beside = [(w, _beside(w, busy.get(w.txn_id))) for w in _work(plan)]
            queued = [(w, labels) for w, labels in beside if labels is not None]
            self._plan_rows([w for w, _ in queued])  # on record before any of it is queued
            for work, labels in queued:
                pool.submit(
                    work.txn_id, labels, functools.partial(self._incident, work), first=DRAIN in labels
                )
        for key, label, job in upkeep.work(due):  # after the incidents' own work: theirs is the urgent one
            if pool is None:
                job()
            else:
                pool.submit(key, {label}, job)
        findings = [*findings, *(held_finding(held, rules) for held in plan.held)]
        self._tell(findings, plan.open_txns)
        return findings

    def _orphans(
        self, live: Collection[tuple[str, int, int]] | None, busy: dict[str, frozenset[str]]
    ) -> Orphans:
        return Orphans(live, self._timeout_ms, busy)

    def _plan_rows(self, works: list[_Work]) -> None:
        """A `planned` row per new action, naming this executor, before any runs: an executor that
        dies before it starts one leaves its successor the row (remediation.reconcile runs it)."""
        mine, at = owner(), now_ms()
        rows = [
            {
                "txn_id": decision.finding["txn_id"],
                "finding_id": decision.finding["finding_id"],
                "action": action_label(action),
                "target": decision.finding["node_id"],
                "status": PLANNED,
                "detail": {OWNER: mine, "planned_at": iso(self.at_ms)},
                "started_at": at,
                "finished_at": None,
            }
            for work in works
            for decision in work.decisions
            for action in decision.actions
        ]
        if rows:
            with self._records, self._store() as store:
                store.insert_rows("actions", [action_row(row, at) for row in rows])

    def _reconcile(
        self,
        ledger: Ledger,
        live: Collection[tuple[str, int, int]] | None,
        busy: dict[str, frozenset[str]],
        shaped: _Shaped,
    ) -> dict[str, tuple[str, list[str]]]:
        """Settle what dead executors left in flight; the actions of theirs that never started."""
        environment, names = self.ctx.slurm_environment, self.ctx.slurm_names
        done = reconcile(
            ledger,
            Orphans(live, self._timeout_ms, busy),
            self.at_ms,
            names,
            lambda: read_nodes(environment),
            shaped.plan,
        )
        for state, status in done.settled:
            why = f"{RECONCILED}: in flight since {iso(state.started_ms)}"
            rule = shaped.rule_of(state.finding_id)
            emit(ActionEvent(state.action, status, state.target, rule, state.txn_id, why))
        return done.unstarted

    def _timeout_ms(self, action: str) -> int:
        """How long an action may be in flight before it is taken for dead (no executor named)."""
        if action in (REBASELINE, VERIFY):  # baseline.yml's suites, verify.yml's too
            return self.rebaseline_timeout * 1000
        if action.startswith("playbook:"):
            return self.playbook_timeout * 1000
        return max(600_000, int(self.http_timeout * (self.http_retries + 1) * 2000))

    def _tell(self, findings: list[dict[str, Any]], open_txns: set[str]) -> None:
        """Each finding's outcome line also says what its incident waits for: a retry and when, a
        person; the spool replayed first if actions had to wait for the store."""
        try:
            with self._store() as store:
                if self.spooled:
                    self._replay_spool(store)
                states = Ledger(store).action_states(open_txns) if open_txns else []
        except StoreError:
            return  # the next run replays the spool; the outcome lines say what was done
        with self._said:
            attempted, retried = set(self._attempted), {t: list(d) for t, d in self._retried.items()}
        said = notes(states, self.backoff, attempted)
        for txn, done in retried.items():
            said[txn] = [*done, *said.get(txn, [])]
        for finding in findings:
            extra = said.get(finding.get("txn_id") or "")
            if extra:
                finding["outcome"] = "; ".join(
                    [finding["outcome"], *extra] if finding.get("outcome") else extra
                )

    def _replay_spool(self, store: Store) -> None:
        """Actions a previous run could not record; a spool that cannot be replayed never stops acting."""
        try:
            report = self._spool().replay(store)
        except StoreError:
            raise
        except Exception as exc:
            print(f"stethoscope: spool {self.ctx.spool_dir} not replayed: {exc}", file=sys.stderr)
            return
        for problem in report.problems:
            print(f"stethoscope: spool: {problem}", file=sys.stderr)

    def _spool(self) -> Spool:
        return Spool(self.ctx.spool_dir, self.ctx.dsn, self.ctx.database)

    def _arm_breaker(self, ledger: Ledger, expire: bool = True) -> None:
        """Who is out of service now and who was isolated within the window, from the actions
        table and, where it can be asked, Slurm; in-flight drains past their timeout expire (with
        `expire`; else they are only looked at)."""
        slurm = read_nodes(self.ctx.slurm_environment)
        names = self.ctx.slurm_names
        self.breaker.arm(
            ledger,
            names,
            slurm,
            now_ms(),
            self.playbook_timeout * 1000,
            (lambda drain: self._expire(ledger, drain, slurm)) if expire else None,
        )
        publish_breaker(self.breaker.state())

    def _expire(self, ledger: Ledger, drain: Drain, slurm: dict[str, Any] | None) -> bool:
        """An in-flight drain whose executor died: in place if Slurm shows its reason, else expired."""
        names = {name: host.slurm_name for name, host in self.ctx.inventory.hosts.items()}
        in_place = drain_in_place(drain, names, slurm)
        reason = "Slurm shows its drain" if in_place else "Slurm shows no drain of its txn"
        if slurm is None:
            reason = "Slurm could not be asked"
        row = {
            "txn_id": drain.txn_id,
            "finding_id": drain.finding_id,
            "action": DRAIN,
            "target": drain.node,
            "status": "ok" if in_place else "expired",
            "detail": {"reason": f"in flight past its timeout ({self.playbook_timeout} s): {reason}"},
            "started_at": drain.started_ms,
            "finished_at": now_ms(),
        }
        ledger.write_action(row, now_ms())
        why = f"in flight past its timeout ({self.playbook_timeout} s): {reason}"
        emit(ActionEvent(DRAIN, "ok" if in_place else "expired", drain.node, "", drain.txn_id, why))
        return in_place

    def _record(self, row: dict[str, Any]) -> None:
        """Into `actions`; if the store cannot take it now, into the spool (replayed after the run)."""
        with self._records:
            version = now_ms()
            try:
                with self._store() as store:
                    Ledger(store).write_action(row, version)
            except StoreError as exc:
                self._spool().append("actions", [action_row(row, version)])
                if not self.spooled:
                    print(f"stethoscope: actions spooled, the store is unavailable: {exc}", file=sys.stderr)
                self.spooled = True

    def _incident(self, work: _Work) -> None:
        """One incident's retries and new actions, in order; past its last retry, a person is asked."""
        failed: list[tuple[dict[str, Any], Outcome]] = []
        for retry in work.retries:
            if not self._room_for(retry):
                continue  # still refused: no attempt, no row, no alert; the outcome line says it waits
            done = self._act(retry.finding, retry.action, retry.earlier)
            with self._said:
                self._retried.setdefault(work.txn_id, []).append(
                    f"retried {done.label} {done.status} (attempt {done.attempt} of {self.backoff.attempts})"
                )
            failed.append((retry.finding, done))
        for decision in work.decisions:
            failed += [(decision.finding, done) for done in self._act_all(decision)]
        before = [(f, Outcome(s.action, s.status, attempt_of(s.detail), s.detail)) for f, s in work.exhausted]
        last = [
            (f, done)
            for f, done in failed
            if done.status in ATTEMPTED and done.attempt >= self.backoff.attempts
        ]
        if (before or last) and not work.asked:
            self._ask_a_person(work.txn_id, [*before, *last])

    def _room_for(self, retry: Retry) -> bool:
        """A drain the breaker refused is tried again only when the breaker has room for its node."""
        earlier = retry.earlier
        if earlier.status != REFUSED or earlier.action != DRAIN:
            return True
        return self.breaker.room(retry.node)[0]

    def _ask_a_person(self, txn_id: str, failures: list[tuple[dict[str, Any], Outcome]]) -> None:
        """Mark the incident as needing a person (an actions row) and alert it, once."""
        finding = {**failures[0][0], "txn_id": txn_id}
        what = "; ".join(
            f"{done.label} {done.status} {done.attempt} times ({reason_of(done.detail) or 'no reason given'})"
            for _, done in failures
        )
        node = finding["node_id"]
        message = f"stethoscope: incident {txn_id} on {node} needs a person: {what}"
        context = template_context(finding, txn_id, self.ctx.variables)
        alert = send_alert(self, Act(finding, {}, context), message)
        self._record(
            note_row(
                txn_id,
                NEEDS_PERSON,
                node,
                {
                    "reason": what,
                    "actions": [done.label for _, done in failures],
                    "alert": alert[0],
                    "tried_at": iso(self.at_ms),
                },
            )
        )
        action = failures[0][1].label
        emit(ActionEvent(action, NEEDS_PERSON, node, finding.get("rule_id", ""), txn_id, what))

    def _act_all(self, decision: Decision) -> list[Outcome]:
        finding = decision.finding
        results = []
        if decision.escalation is not None:
            escalation = decision.escalation
            detail = {**escalation, "runs": [action_label(a) for a in decision.actions]}
            self._record(
                note_row(finding["txn_id"], ESCALATE, finding["node_id"], detail, finding["finding_id"])
            )
            results.append(
                f"escalated {escalation['from']} -> {escalation['to']} under txn {finding['txn_id']}"
            )
            if escalation.get("reason"):  # resumed without repair (remediation/repair.py)
                results[-1] += f" ({escalation['reason']}: txn {escalation.get('resumed_txn', '')})"
        elif decision.joined:
            results.append(f"joined incident {finding['txn_id']} ({decision.joined})")
        done = [self._act(finding, action) for action in decision.actions]
        parts = [f"{d.label} {d.status}" for d in done]
        if decision.joined and not decision.escalation:
            finding["outcome"] = f"{results[0]}: {', '.join(parts)}"
        else:
            finding["outcome"] = ", ".join(results + parts)
        return done

    def _act(self, finding: dict[str, Any], action: Action, earlier: ActionState | None = None) -> Outcome:
        """One attempt of an action: the first, or the next after `earlier` (a retry), recorded with
        the attempts before it."""
        label = action_label(action)
        attempt = next_attempt(earlier)  # a refusal ran nothing: its attempt is this one
        if earlier is not None:  # under the transaction and on the node of the action's own row
            finding = {**finding, "txn_id": earlier.txn_id, "node_id": earlier.target or finding["node_id"]}
        row = {
            "txn_id": finding["txn_id"],
            "finding_id": finding["finding_id"],
            "action": label,
            "target": finding["node_id"],
            "status": "in_flight",
            "detail": attempt_detail(None, "in_flight", attempt, self.at_ms, self.backoff, earlier),
            "started_at": now_ms(),
            "finished_at": None,
        }
        row["detail"][OWNER] = owner()  # whose it is: reconcile tells an orphan by it
        with self._said:
            self._attempted.add((row["txn_id"], row["finding_id"], label))
        self._record(row)  # the intent is on record before the action starts
        try:
            refused_before = earlier is not None and earlier.status == REFUSED
            status, target, detail = self._dispatch(finding, action, refused_before)
        except TemplateFailure as exc:
            status, target, detail = "failed", row["target"], {"error": str(exc)}
        except Exception as exc:  # one action's failure is recorded; the incident's other actions still run
            status, target, detail = "failed", row["target"], {"error": f"{type(exc).__name__}: {exc}"}
        if target and target != row["target"]:  # the row's key stays the node; where it went is detail
            detail = {
                **(detail if isinstance(detail, dict) else {"detail": detail}),
                "endpoint": redact(target),
            }
        detail = attempt_detail(detail, status, attempt, self.at_ms, self.backoff, earlier)
        row.update(status=status, detail=detail, finished_at=now_ms())
        self._record(row)
        if label == DRAIN and status == REFUSED:  # its row changes when it is tried again: the refusal stays
            refusal = note_row(row["txn_id"], BREAKER_REFUSAL, row["target"], detail, row["finding_id"])
            self._record({**refusal, "status": REFUSED})
        if label == DRAIN:
            self.breaker.settle(row["target"])  # on record: the ledger counts it (or not) from now on
        why = "" if status == "ok" else reason_of(detail)
        key = ticket_key(detail)
        emit(ActionEvent(label, status, row["target"], finding["rule_id"], row["txn_id"], why, key, attempt))
        return Outcome(label, status, attempt, detail)

    def _dispatch(
        self, finding: dict[str, Any], action: Action, refused_before: bool = False
    ) -> tuple[str, str, Any]:
        context = template_context(finding, finding["txn_id"], self.ctx.variables)
        return handler(action.type)(self, Act(finding, dict(action.params), context, refused_before))
