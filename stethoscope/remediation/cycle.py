"""One diagnosis cycle, the same for `diagnose` (once), `watch` and `serve` (every interval): learn the
cadence the series report at, evaluate the rules and the model, hold open what did not match but is
not yet clear (diagnosis.hysteresis), cap stream-only findings at L3, and with --execute act on the
findings under the database's executor lock and heartbeat, the circuit breaker inside the executor.
It prints nothing: its callers print (`render_result`).

The executor lock is keyed by the DSN and the database (remediation.lock), not by a folder. A one-shot
run holds it for its cycle; a long-running one (`watch --execute`, `serve --execute`) for its whole
life, so that no other executor acts on the same database between its cycles."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.cadence import Cadence
from stethoscope.diagnosis.findings import (
    RULE_FAILED,
    diagnose,
    held_finding,
    printable,
    render,
)
from stethoscope.diagnosis.hysteresis import HELD, Held, Previous, held_reason, settle_all
from stethoscope.diagnosis.job_watch import JobWatch
from stethoscope.diagnosis.levels import SEVERITY_ORDER
from stethoscope.diagnosis.model_findings import ModelUse
from stethoscope.diagnosis.rules import Rule
from stethoscope.diagnosis.unknown import Fleet, record_new_hosts
from stethoscope.remediation.action_pool import ActionPool
from stethoscope.remediation.ledger import Ledger
from stethoscope.remediation.lock import Beating, ExecutorLock, Heartbeat, lock_path
from stethoscope.remediation.record import DRY_RUN, EXECUTE, record_dry_run, record_evaluation
from stethoscope.remediation.settings import Settings
from stethoscope.remediation.silence_table import apply_silences
from stethoscope.remediation.stream_cap import cap_stream_only, stream_only_metrics
from stethoscope.store.client import Store
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.terminal import terminal_safe, terminal_safe_data


@dataclass
class CycleResult:
    at_ms: int
    findings: list[dict[str, Any]]  # matched, and held open though they did not match; worst first
    rules: int
    executing: bool  # --execute was given
    standby: str = ""  # why an executing run did not act: another host's executor does
    seconds: float = 0.0
    model: ModelUse | None = None
    failed_rules: list[str] = field(default_factory=list)  # the rules whose evaluation failed
    unread_rules: list[str] = field(default_factory=list)  # of those, the ones whose query failed

    @property
    def acted(self) -> bool:
        return self.executing and not self.standby

    @property
    def every_rule_failed(self) -> bool:
        """Nothing of the rules was read: the cycle as a whole failed (the other case costs those rules)."""
        return self.rules > 0 and len(set(self.unread_rules)) >= self.rules


@dataclass
class Cycles:
    """The cycles of one command. Long-running commands keep it from one cycle to the next: its lock,
    heartbeat, and in a dry-run the findings it saw open (there is no ledger to hold them)."""

    dsn: str | None
    database: str | None
    catalog: Catalog
    execute_with: Any = None  # (dsn, database) -> remediation.executor.Context; None: dry-run
    nodes: Sequence[str] | None = None
    fleet: Fleet | None = None
    model: ModelUse | None = None
    long_running: bool = False
    stream_names: set[str] | None = None
    background: bool = False  # serve: actions run on a pool beside the cycles (remediation.action_pool)
    # called once, before the first executing cycle acts: (context, findings, rules, at_ms, model
    # nodes); serve logs the plan (remediation.plan) with it
    before_acting: Any = None
    # (dsn, database) -> Context of a run that does not act (diagnose --plan): its findings silenced
    # and capped as its executor's would be (its Slurm environment and names, stream isolation)
    judge_with: Any = None
    jobs: JobWatch | None = None  # the inventory's job settings (warm-up); None: the defaults
    _lock: ExecutorLock | None = field(default=None, repr=False)
    _pool: ActionPool | None = field(default=None, repr=False)
    _breaker: Any = field(default=None, repr=False)  # one for all cycles: the pool's work outlives one
    _heartbeat: Heartbeat | None = field(default=None, repr=False)
    _beating: Beating | None = field(default=None, repr=False)  # a long-running one's beats between cycles
    _seen: dict[str, Previous] = field(default_factory=dict, repr=False)  # a dry-run's open findings

    def run(self, rules: list[Rule], at_ms: int, store: Store | None = None) -> CycleResult:
        """One cycle at `at_ms`. `store`: a handle the caller holds open (serve), else one is opened
        for the evaluation and closed before anything acts. Raises LockHeld when another run holds
        this database's executor lock (nothing done)."""
        started = time.monotonic()
        executing = self.execute_with is not None
        named = store or Store(self.dsn, self.database)  # the DSN and database as resolved
        context = self.execute_with(named.dsn, named.database) if executing else None
        self.claim()
        standby = ""
        try:
            with _handle(store, self.dsn, self.database) as handle:
                cadence = Cadence.learn(handle, at_ms, self.nodes)
                fitted = cadence.fit_all(rules)
                live: set[tuple[str, int, int]] | None = None
                if context is not None:
                    standby = self._beat(handle, context)
                    live = None if standby or self._heartbeat is None else self._heartbeat.live(handle)
                findings = diagnose(
                    handle, rules, at_ms, self.catalog, self.nodes, self.fleet, self.model, cadence, self.jobs
                )
                if context is None or standby:
                    findings += self._held(handle, findings, fitted, at_ms)
                judged = context
                if judged is None and self.judge_with is not None:
                    judged = self.judge_with(named.dsn, named.database)
                apply_silences(handle, findings, judged)  # a silenced finding takes no action
            if judged is None or not judged.setting("stethoscope_stream_isolation", False):
                cap_stream_only(findings, fitted, self._stream_names())
            if context is not None and not standby:
                from stethoscope.remediation.executor import Executor

                evaluated = self.model.evaluated if self.model is not None and self.model.ran else None
                executor = Executor(context, self._breaker)
                if self.long_running:
                    self._breaker = executor.breaker
                if self.before_acting is not None:
                    self.before_acting(context, findings, fitted, at_ms, evaluated)
                    self.before_acting = None
                if self.background and self._pool is None:
                    self._pool = ActionPool(executor.parallel)
                findings = executor.run(
                    findings, fitted, at_ms, model_nodes=evaluated, live=live, pool=self._pool
                )
            if (context is None and self.long_running) or (context is not None and not standby):
                self._record(store, findings, fitted, at_ms, len(rules), dry_run=context is None)
        finally:
            if not self.long_running:
                self.close()
        findings.sort(key=lambda f: (-SEVERITY_ORDER[f["severity"]], f["node_id"], f["rule_id"], f["device"]))
        failed = [f for f in findings if f["rule_id"] == RULE_FAILED and not f.get("held")]
        return CycleResult(
            at_ms,
            findings,
            len(rules),
            executing,
            standby,
            time.monotonic() - started,
            self.model,
            [f["device"] for f in failed],
            # the rules nothing was read of (a failed query): a message or a series that failed costs less
            [f["device"] for f in failed if f.get("unread")],
        )

    def claim(self) -> None:
        """Take this database's executor lock, if this command executes and does not hold it yet: a
        long-running one calls it at its start, so that it refuses to start beside another."""
        if self.execute_with is None or self._lock is not None:
            return
        named = Store(self.dsn, self.database)  # the DSN and database as resolved
        self._lock = ExecutorLock(lock_path(named.dsn, named.database)).acquire()

    def _beat(self, store: Store, context: Any) -> str:
        """This executor's heartbeat: '' when it acts, else why it stands by."""
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(Settings.of(context).beat_seconds)  # the database's, not --interval
            if self.long_running:
                self._beating = Beating(self._heartbeat, store.dsn, store.database).start()
        return self._heartbeat.beat(store)

    def mode(self, store: Store) -> str:
        """The mode this command runs in, for its first log line: executing, standby and why, or
        dry-run. An executing one claims the lock (if not yet) and beats once to know."""
        if self.execute_with is None:
            return "dry-run (no --execute)"
        self.claim()
        standby = self._beat(store, self.execute_with(store.dsn, store.database))
        if standby:
            return f"{standby}; standing by (executing when it stops)"
        held = f"pid {os.getpid()} holds the executor lock of database {store.database}"
        return f"executing ({held}; actions {'beside' if self.background else 'within'} the cycles)"

    def actions_running(self) -> int:
        """Incidents whose actions still run on the pool."""
        return self._pool.pending() if self._pool is not None else 0

    def close(self) -> None:
        """Let the actions under way finish, retire the heartbeat (another host may take over at
        once) and release the lock."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        try:
            if self._beating is not None:
                self._beating.stop()
                self._beating = None
            if self._heartbeat is not None:
                with Store(self.dsn, self.database) as store:
                    self._heartbeat.retire(store)
        finally:
            self._heartbeat = None
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _record(
        self,
        store: Store | None,
        findings: list[dict[str, Any]],
        fitted: list[Rule],
        at_ms: int,
        rules: int,
        dry_run: bool,
    ) -> None:
        """`watch` and `serve` keep every cycle's findings, acting or not, and each cycle that keeps
        them says it evaluated (remediation.record): the board's past days are read from these. The
        inventory's hosts the store never saw get their first sight, from which UNKNOWN's grace for a
        new host counts: only here, so that a command that only looks writes nothing."""
        with _handle(store, self.dsn, self.database) as handle:
            if self.fleet is not None:
                record_new_hosts(handle, self.fleet, at_ms)
            if dry_run:
                seen = self.model.evaluated if self.model is not None and self.model.ran else None
                record_dry_run(handle, findings, fitted, at_ms, self.nodes, seen)
            mode = DRY_RUN if dry_run else EXECUTE
            record_evaluation(handle, at_ms, mode, rules, self.nodes, len(findings))

    def _stream_names(self) -> set[str]:
        if self.stream_names is None:
            sets = load_sets(catalog=self.catalog)
            self.stream_names = stream_only_metrics({s.id: s for s in sets.values()}, self.catalog)
        return self.stream_names

    def _held(
        self, store: Store, findings: list[dict[str, Any]], rules: list[Rule], at_ms: int
    ) -> list[dict[str, Any]]:
        """A dry-run's view of the hysteresis: the open findings of the ledger (an executor's, read
        only) and of this command's earlier cycles that did not match now and are not yet clear."""
        matched = {f["finding_id"] for f in findings}
        hosts = None if self.nodes is None else set(self.nodes)
        known = {
            k.finding_id: k.previous()
            for k in Ledger(store).known_findings().values()
            if k.status != "resolved" and (hosts is None or k.node_id in hosts)
        }
        previous = {**known, **self._seen}
        rule_ids = {rule.rule_id for rule in rules}
        silent = [p for p in previous.values() if p.finding_id not in matched and p.rule_id in rule_ids]
        verdicts = settle_all(store, rules, silent, at_ms)
        held = [Held(p, held_reason(p, rules)) for p in silent if verdicts.get(p.finding_id) == HELD]
        if self.long_running and self.execute_with is None:
            self._seen = {p.finding_id: p for p in (h.previous for h in held)}
            for f in findings:
                first = previous[f["finding_id"]].first_seen_ms if f["finding_id"] in previous else at_ms
                self._seen[f["finding_id"]] = _remembered(f, first, at_ms)
        return [held_finding(h, rules) for h in held]


def _remembered(finding: dict[str, Any], first_seen_ms: int, at_ms: int) -> Previous:
    return Previous(
        finding["finding_id"],
        finding["rule_id"],
        finding["node_id"],
        finding["device"],
        finding["severity"],
        "open",
        first_seen_ms,
        at_ms,
        "",
        finding["level"],
        float(finding["confidence"]),
        finding["message"],
        finding["evidence"],
    )


class _handle:
    """The caller's open store (left open), or one opened now and closed at the end of the block."""

    def __init__(self, store: Store | None, dsn: str | None, database: str | None):
        self.given, self.dsn, self.database = store, dsn, database
        self.opened: Store | None = None

    def __enter__(self) -> Store:
        if self.given is not None:
            return self.given
        self.opened = Store(self.dsn, self.database).open()
        return self.opened

    def __exit__(self, *exc_info: object) -> None:
        if self.opened is not None:
            self.opened.close()


def render_result(result: CycleResult, as_json: bool) -> str:
    """What `diagnose` and `watch` print for a cycle: JSON findings, or one line per alarm."""
    extra = ("txn_id", "outcome", "silenced") if result.acted else ("outcome", "silenced")
    if as_json:
        return json.dumps([printable(f, extra) for f in result.findings], indent=1)
    name = result.model.describe() if result.model is not None else ""
    shown = terminal_safe_data(result.findings)  # devices, messages, node names are the nodes' text
    return render(shown, result.rules, executed=result.acted, model=terminal_safe(name))


def worst(findings: list[dict[str, Any]]) -> int:
    return max((SEVERITY_ORDER[f["severity"]] for f in findings), default=-1)
