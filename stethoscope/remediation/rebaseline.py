"""Re-baselines and verifies that run themselves (docs/remediation.md "Re-baselines and verify that
run themselves"), planned
and run by the executor's cycle (`diagnose --execute`, `watch --execute`, `serve --execute`).

- A node whose fingerprint changed (the `hardware_changed_rebaseline` rule matches it) or that joined
  the fleet (its oldest facts row over an hour younger than the inventory's oldest, within a week),
  neither silenced nor in Slurm maintenance, gets one re-baseline per node fingerprint: an `actions`
  row `rebaseline` under the transaction
  `rb-<hash of node and fingerprint>`, so that a finding matching cycle after cycle plans it once.
- It waits (status `waiting`, the reason in its detail) until the configured window
  (`stethoscope_rebaseline_window`, `Window`) is open by the clock; no window configured, it never
  runs by itself; nor unless Slurm is the scheduler (baseline.yml drains first) or the inventory opts
  in (`stethoscope_rebaseline_without_scheduler`: no jobs to benchmark under).
- In the window, the waiting nodes run in batches per class: each node where the circuit breaker has
  room, checked, not reserved (planned work, not an isolation; a node refused waits, the reason
  said), none a stethoscope drain holds (its verify benchmarks it); the batch runs baseline.yml
  --limit those nodes under a batch transaction `rbb-…` within `stethoscope_rebaseline_timeout`,
  whose Slurm preflight drains each node first and resumes only the nodes it drained; a run that
  did not succeed is followed by baseline_restore.yml (env_lock restored, its own drains resumed).
  Each node's outcome is its own: skipped or failed, it waits for a later window (`MAX_ATTEMPTS`).
- Verify: `stethoscope incidents repaired TXN` writes a `repaired` row; a node stethoscope keeps
  drained whose sweep after the drain shows a part swapped for one like it (`shows_a_repair`) gets
  one too (`by: fingerprint change`).
  The next executing cycle runs remediate/verify.yml for it (what `stethoscope verify` is run by),
  once per `repaired` row: a verify that keeps the node drained waits for the next repair mark.

Rows stay out of the retries and of the crash reconciliation (their statuses are their own: waiting,
running, ok, failed, needs_person); a `running` row whose executor died runs again under its recorded
batch txn and members (only that txn resumes the drains it left)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from stethoscope.priority import BACKGROUND_NICENESS
from stethoscope.remediation.action_events import ActionEvent, emit, short_action
from stethoscope.remediation.actions.playbook import playbook_environment, run_playbook
from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.breaker_state import armed
from stethoscope.remediation.context import Context
from stethoscope.remediation.ledger import REBASELINE, REPAIRED, VERIFY, ActionState, Ledger, note_row
from stethoscope.remediation.reconcile import OWNER, Orphans, owner
from stethoscope.remediation.silence_table import silencer
from stethoscope.remediation.window import WINDOW_SETTING, Window
from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms

HARDWARE_RULE = "hardware_changed_rebaseline"
NO_SCHEDULER_SETTING = "stethoscope_rebaseline_without_scheduler"  # benchmarks with no drain: no jobs run
WAITING, RUNNING, GIVEN_UP = "waiting", "running", "needs_person"
FINISHED = ("ok", "failed")  # GIVEN_UP ends a row too, and stays listed: a person is to act
NOT_DONE = (WAITING, RUNNING, GIVEN_UP)  # a re-baseline's statuses before `ok` (a failed try waits again)
DUE = "due"  # a verify a repair mark asks for, not started yet
MAX_ATTEMPTS = 3  # a node skipped or failed this many times is left to a person
RETRY_AFTER_MS = 6 * 3600_000  # ... and before that waits this long: a later window, not the next cycle
FINGERPRINT_CHANGED, JOINED = "fingerprint changed", "joined the fleet"
JOIN_AFTER_MS = 3600_000  # first seen this long after the fleet's first sight: a node that joined
JOIN_RECENT_MS = 7 * 24 * 3600_000  # ... and no longer ago than this


def window_of(context: Context) -> Window | None:
    return Window.parse(context.setting(WINDOW_SETTING))


def rebaseline_txn(node: str, fingerprint: str) -> str:
    return "rb-" + hashlib.sha256(f"{node}\0{fingerprint}".encode()).hexdigest()[:16]


def batch_txn(txns: Iterable[str]) -> str:
    return "rbb-" + hashlib.sha256("\0".join(sorted(txns)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Fingerprint:
    node: str
    node_fingerprint: str
    class_fingerprint: str
    collected_ms: int


# a sweep's fingerprint: a baseline's also holds the state env_lock set (another class on purpose),
# and the sweeps' are the ones node_fingerprint_changes_total compares; a sweep whose fingerprint
# failed stores a row without one, which must not hide the node's last fingerprint
SWEPT = (
    "collector = 'fingerprint' AND JSONHas(facts, 'node_fingerprint') "
    "AND JSONExtractRaw(facts, 'detail', 'env_lock') IN ('', '{}', 'null')"
)


def fingerprints(store: Store, nodes: Collection[str]) -> dict[str, Fingerprint]:
    """The newest sweep fingerprint of each of `nodes` (those never fingerprinted are absent)."""
    rows = store.query(
        "SELECT node_id, argMax(JSONExtractString(facts, 'node_fingerprint'), collected_at), "
        "argMax(JSONExtractString(facts, 'class_fingerprint'), collected_at), "
        "toUnixTimestamp64Milli(max(collected_at)) "
        f"FROM {store.database}.facts WHERE {SWEPT} AND node_id IN {{n:Array(String)}} "
        "GROUP BY node_id",
        {"n": sorted(nodes)},
    )
    return {str(r[0]): Fingerprint(str(r[0]), str(r[1]), str(r[2]), int(r[3])) for r in rows if r[1]}


def fingerprint_before(store: Store, node: str, before_ms: int) -> str:
    """The node's fingerprint as last swept before `before_ms` ('' if none)."""
    rows = store.query(
        "SELECT argMax(JSONExtractString(facts, 'node_fingerprint'), collected_at) "
        f"FROM {store.database}.facts WHERE {SWEPT} AND node_id = {{n:String}} "
        "AND collected_at < fromUnixTimestamp64Milli({b:Int64}, 'UTC')",
        {"n": node, "b": before_ms},
    )
    return str(rows[0][0]) if rows and rows[0][0] else ""


def swept_facts(store: Store, node: str, before_ms: int | None = None) -> dict[str, Any]:
    """The facts of the node's newest sweep fingerprint (before `before_ms`); {} if none."""
    rows = store.query(
        f"SELECT argMax(facts, collected_at) FROM {store.database}.facts WHERE {SWEPT} "
        "AND node_id = {n:String} AND collected_at < fromUnixTimestamp64Milli({b:Int64}, 'UTC')",
        {"n": node, "b": (1 << 62) if before_ms is None else before_ms},
    )
    try:
        facts = json.loads(rows[0][0]) if rows and rows[0][0] else {}
    except ValueError:
        return {}
    return facts if isinstance(facts, dict) else {}


def shows_a_repair(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """A part swapped for one like it: the same class, other serials, and both sweeps read the parts
    (a tool that failed, e.g. nvidia-smi, changes the fingerprint without any part changing). A changed
    class is no repair: a GPU off the bus changes it, and the node is worse."""
    if not before.get("node_fingerprint") or not after.get("node_fingerprint"):
        return False
    if _failed_read(before) or _failed_read(after):
        return False
    was, now = before.get("detail") or {}, after.get("detail") or {}
    return (
        before.get("class_fingerprint") == after.get("class_fingerprint")
        and before["node_fingerprint"] != after["node_fingerprint"]
        and was.get("serials") != now.get("serials")
    )


def _failed_read(facts: dict[str, Any]) -> bool:
    detail = facts.get("detail")
    return isinstance(detail, dict) and any(isinstance(v, dict) and "error" in v for v in detail.values())


def joined_nodes(store: Store, hosts: Collection[str], at_ms: int) -> set[str]:
    """Inventory hosts first seen an hour or more after the first of them, this week. First sight is
    a host's oldest facts row (those are appended, kept for the raw TTL): `nodes` keeps one row per
    host, rewritten every sweep, whose first sight a merge forgets."""
    rows = store.query(
        "SELECT node_id, toUnixTimestamp64Milli(min(collected_at)) "
        f"FROM {store.database}.facts WHERE node_id IN {{n:Array(String)}} GROUP BY node_id",
        {"n": sorted(hosts)},
    )
    first = {str(node): int(ms) for node, ms in rows}
    if not first:
        return set()
    fleet = min(first.values())
    return {
        node
        for node in hosts
        if node in first and first[node] - fleet >= JOIN_AFTER_MS and at_ms - first[node] <= JOIN_RECENT_MS
    }


@dataclass
class Candidate:
    node: str
    fingerprint: Fingerprint
    why: str

    @property
    def txn_id(self) -> str:
        return rebaseline_txn(self.node, self.fingerprint.node_fingerprint)


def candidates(
    store: Store,
    findings: list[dict[str, Any]],
    hosts: Collection[str],
    at_ms: int,
    silenced: Callable[[dict[str, Any]], str | None] | None = None,
) -> list[Candidate]:
    """Nodes to re-baseline now: a fingerprint change matched this cycle, or a join; neither while a
    silence or a Slurm maintenance reservation holds the node (`silenced`: silence_table.silencer)."""
    quiet = silenced or (lambda finding: None)
    changed = {
        f["node_id"]
        for f in findings
        if f["rule_id"] == HARDWARE_RULE and not f.get("held") and not f.get("silenced") and not quiet(f)
    } & set(hosts)
    joins = joined_nodes(store, hosts, at_ms) - changed
    joined = {n for n in joins if not quiet({"node_id": n, "rule_id": HARDWARE_RULE, "device": ""})}
    prints = fingerprints(store, changed | joined)
    found = [Candidate(n, prints[n], FINGERPRINT_CHANGED) for n in sorted(changed) if n in prints]
    return found + [Candidate(n, prints[n], JOINED) for n in sorted(joined) if n in prints]


def latest_of(ledger: Ledger, action: str, txn_ids: Collection[str] | None = None) -> list[ActionState]:
    return ledger.action_states(txn_ids, actions=[action])


def waiting_reason(window: Window | None, at_ms: int) -> str:
    """'' when the window is open now, else why a re-baseline waits."""
    if window is None:
        return f"waiting: no {WINDOW_SETTING} configured (re-baselines run only inside one)"
    if not window.open_at(at_ms):
        return f"waiting for the window {window.text} (UTC)"
    return ""


def scheduler_reason(context: Context) -> str:
    """'' when a re-baseline may run: Slurm is the scheduler (baseline.yml drains each node first),
    or the inventory says its nodes run no jobs to benchmark under; else why it waits."""
    slurm = context.setting("stethoscope_scheduler") == "slurm"
    if slurm or _said_yes(context.setting(NO_SCHEDULER_SETTING)):
        return ""
    return (
        "waiting: stethoscope_scheduler is not slurm, and baseline.yml would benchmark the node under "
        f"its running jobs (set {NO_SCHEDULER_SETTING}: true where no jobs run)"
    )


def why_waiting(context: Context) -> str:
    """'' when re-baselines may run now (by the clock: `--at` evaluates the past, it runs now)."""
    return scheduler_reason(context) or waiting_reason(window_of(context), now_ms())


def _said_yes(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "yes", "on", "1")


@dataclass
class Due:
    """What an executing cycle runs, each already recorded `running` (a later cycle, or the pool's
    backlog, never starts it twice): batches of re-baselines (per class) with their batch txn, and
    verifies as their running row with the `repaired` row that asked for them."""

    batches: list[tuple[list[ActionState], str]]
    verifies: list[tuple[dict[str, Any], ActionState]]


class Upkeep:
    """The re-baselines and verifies of one executing cycle. `record` writes an actions row (the
    executor's, which spools when the store cannot take it); `orphans` tells a row whose executor
    died; `breaker` is the executor's, armed for this cycle."""

    def __init__(
        self,
        context: Context,
        breaker: CircuitBreaker,
        record: Callable[[dict[str, Any]], None],
        playbook_timeout: int,
        orphans: Orphans,
        run_timeout: int | None = None,
    ):
        self.ctx, self.breaker, self.record = context, breaker, record
        self.playbook_timeout, self.orphans = playbook_timeout, orphans
        # baseline.yml and verify.yml (which imports it) run the suites: up to an hour of storage alone
        self.run_timeout = run_timeout or playbook_timeout
        self._write: Callable[[dict[str, Any]], None] = record

    # planning, under the cycle's store handle ------------------------------------------------
    def plan(self, store: Store, findings: list[dict[str, Any]], at_ms: int, batches: bool = True) -> Due:
        """Plan what the findings ask for, and say what runs now. `batches`: False when this cycle's
        breaker room goes to drains for faults (the re-baselines wait for a later cycle)."""
        ledger = Ledger(store)
        self._write = functools.partial(_write, ledger)
        why_wait = why_waiting(self.ctx)
        found = candidates(store, findings, list(self.ctx.inventory.hosts), at_ms, silencer(store, self.ctx))
        known = {s.txn_id for s in latest_of(ledger, REBASELINE, [c.txn_id for c in found])}
        for candidate in found:
            if candidate.txn_id not in known:
                self._write(self._row(candidate, why_wait or "planned: the window is open"))
        self._mark_changed_as_repaired(store, ledger, found)
        held = {d.node: d.txn_id for d in ledger.drains()}
        pending = [s for s in latest_of(ledger, REBASELINE) if self._pending(s) and not self._held(s, held)]
        if why_wait:
            for state in pending:
                if state.detail.get("reason") != why_wait:
                    self._write(self._again(state, WAITING, {"reason": why_wait}))
        chosen = self._batches(pending) if batches and not why_wait else []
        running = [self._start_batch(batch, txn) for batch, txn in chosen]
        return Due(running, [(self._start_verify(*v), v[2]) for v in self._verifies(ledger)])

    def _start_batch(self, batch: list[ActionState], txn: str) -> tuple[list[ActionState], str]:
        """Each row `running`; the batch as started (its rows' start, kept when they finish)."""
        nodes = [s.target for s in batch]
        running = {
            "reason": f"baseline.yml --limit {','.join(nodes)} under txn {txn}",
            "batch_txn": txn,
            "batch": nodes,
            OWNER: owner(),
        }
        started = now_ms()
        for state in batch:
            self._write({**self._again(state, RUNNING, running), "started_at": started})
        return [dataclasses.replace(s, started_ms=started) for s in batch], txn

    def _start_verify(self, txn: str, node: str, repaired: ActionState) -> dict[str, Any]:
        row = {
            "txn_id": txn,
            "finding_id": "",
            "action": VERIFY,
            "target": node,
            "status": RUNNING,
            "detail": {"reason": f"marked repaired ({repaired.detail.get('by', '?')})", OWNER: owner()},
            "started_at": now_ms(),
            "finished_at": None,
        }
        self._write(row)
        return row

    def _row(self, candidate: Candidate, reason: str) -> dict[str, Any]:
        fingerprint = candidate.fingerprint
        now = now_ms()
        return {
            "txn_id": candidate.txn_id,
            "finding_id": "",
            "action": REBASELINE,
            "target": candidate.node,
            "status": WAITING,
            "detail": {
                "reason": reason,
                "why": candidate.why,
                "node_fingerprint": fingerprint.node_fingerprint,
                "class_fingerprint": fingerprint.class_fingerprint,
                "planned_at": iso(now),
            },
            "started_at": now,
            "finished_at": None,
        }

    def _pending(self, state: ActionState) -> bool:
        if state.status == WAITING:
            return int(state.detail.get("not_before_ms") or 0) <= now_ms()
        if state.status != RUNNING or state.detail.get("batch_txn") in self.orphans.busy:
            return False  # the pool runs a batch under its batch txn, not its members' txns
        return self.orphans.orphaned(state, now_ms())

    def _held(self, state: ActionState, held: dict[str, str]) -> bool:
        """A node a stethoscope drain holds waits: its verify benchmarks it (baseline.yml beside
        verify.yml on one node would run the suites twice at once)."""
        if state.target not in held:
            return False
        reason = f"waiting: drained by stethoscope under txn {held[state.target]} (its verify benchmarks it)"
        if state.detail.get("reason") != reason:
            self._write(self._again(state, WAITING, {"reason": reason}))
        return True

    def _batches(self, pending: list[ActionState]) -> list[tuple[list[ActionState], str]]:
        """(batch, its txn) to run now. A batch whose run was cut off runs again under its recorded txn
        (its baseline drains carry that txn: only it resumes them); the others go per class under a new
        one. Each node only where the breaker has room, checked, not reserved: a re-baseline is planned
        work, not an isolation (DESIGN); the others wait, saying why."""
        groups: dict[tuple[str, str], list[ActionState]] = {}
        for state in pending:
            recorded = str(state.detail.get("batch_txn") or "")
            key = ("again", recorded) if recorded else ("class", str(state.detail.get("class_fingerprint")))
            groups.setdefault(key, []).append(state)
        batches: list[tuple[list[ActionState], str]] = []
        taken: list[str] = []
        for kind, name in sorted(groups):
            batch = [s for s in sorted(groups[kind, name], key=lambda s: s.target) if self._room(s, taken)]
            if batch:
                batches.append((batch, name if kind == "again" else batch_txn(s.txn_id for s in batch)))
        return batches

    def _room(self, state: ActionState, taken: list[str]) -> bool:
        """Whether the breaker has room for `state`'s node beside the nodes `taken` this cycle (as
        baseline.yml's capacity check counts them); one it has not waits, saying why."""
        allowed, why = self.breaker.room(state.target)
        out, limit = self.breaker.isolated, self.breaker.allowed_out_of_service
        if allowed and state.target not in out and len(out) + len(taken) >= limit:
            allowed = False
            why = (
                f"out-of-service limit: {len(out)} nodes out of service and {len(taken)} re-baselining "
                f"({', '.join(taken)}), the limit is {limit}"
            )
        if allowed:
            taken.append(state.target)
            return True
        reason = f"waiting for the breaker: {why}"
        if state.detail.get("reason") != reason:
            self._write(self._again(state, WAITING, {"reason": reason}))
        return False

    def _again(self, state: ActionState, status: str, changes: dict[str, Any]) -> dict[str, Any]:
        finished = now_ms() if status in (*FINISHED, GIVEN_UP) else None
        return {
            "txn_id": state.txn_id,
            "finding_id": state.finding_id,
            "action": state.action,
            "target": state.target,
            "status": status,
            "detail": {**{k: v for k, v in state.detail.items() if k != OWNER}, **changes},
            "started_at": state.started_ms,
            "finished_at": finished,
        }

    def _mark_changed_as_repaired(self, store: Store, ledger: Ledger, found: list[Candidate]) -> None:
        """A node stethoscope keeps drained whose fingerprint changed since its drain was repaired."""
        changed = {c.node: c for c in found if c.why == FINGERPRINT_CHANGED}
        drains = [d for d in ledger.drains() if d.node in changed and d.status == "ok"]
        marked = {(s.txn_id, s.target) for s in latest_of(ledger, REPAIRED, [d.txn_id for d in drains])}
        for drain in drains:
            now = changed[drain.node].fingerprint
            if (drain.txn_id, drain.node) in marked or now.collected_ms <= drain.started_ms:
                continue
            before, after = swept_facts(store, drain.node, drain.started_ms), swept_facts(store, drain.node)
            if shows_a_repair(before, after):
                swapped = (before["node_fingerprint"], after["node_fingerprint"])
                detail = {"by": "fingerprint change", "from": swapped[0], "to": swapped[1]}
                self._write(note_row(drain.txn_id, REPAIRED, drain.node, detail))

    def _verifies(self, ledger: Ledger) -> list[tuple[str, str, ActionState]]:
        return verifies_due(ledger, self.orphans)

    # running, with no store handle held ------------------------------------------------------
    def work(self, due: Due) -> list[tuple[str, str, Callable[[], None]]]:
        """(pool key, label, work) for each batch and verify: the caller runs them in order or on its pool."""
        jobs: list[tuple[str, str, Callable[[], None]]] = []
        for batch, txn in due.batches:
            jobs.append((txn, REBASELINE, functools.partial(self.rebaseline, batch, txn)))
        for row, repaired in due.verifies:
            jobs.append((row["txn_id"], VERIFY, functools.partial(self.verify, row, repaired)))
        return jobs

    def rebaseline(self, batch: list[ActionState], txn: str) -> None:
        nodes = [s.target for s in batch]
        ran = f"baseline.yml --limit {','.join(nodes)} under txn {txn}"
        running: dict[str, Any] = {"reason": ran, "batch_txn": txn, "batch": nodes}
        extravars = {**self.ctx.overrides, "stethoscope_txn_id": txn}
        try:
            result = self._run("baseline.yml", ",".join(nodes), extravars, {}, self.run_timeout)
        except Exception as exc:
            result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        if not result["ok"]:  # cut off (timeout, an exception) before its `always`: run what it does
            result["restore"] = self._restore(nodes, txn)
        outcomes = node_outcomes(nodes, result)
        for state in batch:
            outcome, why = outcomes[state.target]
            changes = {**running, **result, "reason": why or running["reason"]}
            status, changes = self._next_try(state, outcome, changes)
            self.record(self._again(state, status, changes))
            rule = HARDWARE_RULE if state.detail.get("why") == FINGERPRINT_CHANGED else ""
            said = status if status == GIVEN_UP else "skipped" if outcome == WAITING else outcome
            emit(ActionEvent(REBASELINE, said, state.target, rule, state.txn_id, why))

    def _next_try(
        self, state: ActionState, status: str, changes: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """A node skipped or failed waits for a later window, its attempts counted; past the last it is
        left to a person. A later run is a new batch (the `batch_txn` of this one is done)."""
        if status == "ok":
            return status, changes
        attempts = int(state.detail.get("attempts") or 0) + 1
        if attempts >= MAX_ATTEMPTS:
            why = f"{changes['reason']} (attempt {attempts} of {MAX_ATTEMPTS}: left to a person)"
            return GIVEN_UP, {**changes, "attempts": attempts, "reason": why}
        later = now_ms() + RETRY_AFTER_MS
        why = f"{changes['reason']} (attempt {attempts} of {MAX_ATTEMPTS}; again from {iso(later)})"
        retry = {"attempts": attempts, "not_before_ms": later, "last": status, "reason": why, "batch_txn": ""}
        return WAITING, {**changes, **retry}

    def _restore(self, nodes: list[str], txn: str) -> dict[str, Any]:
        """baseline_restore.yml: env_lock restored and this txn's own baseline drains resumed."""
        extravars = {**self.ctx.overrides, "stethoscope_txn_id": txn}
        try:
            done = self._run("baseline_restore.yml", ",".join(nodes), extravars, {}, self.playbook_timeout)
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {k: done[k] for k in ("ok", "rc", "runner_status")}

    def verify(self, row: dict[str, Any], repaired: ActionState) -> None:
        txn, node = row["txn_id"], row["target"]
        try:
            result = self._run(
                VERIFY.removeprefix("playbook:"),
                node,
                dict(self.ctx.overrides),
                {"stethoscope_txn_id": txn},
                self.run_timeout,
            )
            status = "ok" if result["ok"] else "failed"
        except Exception as exc:
            result, status = {"error": f"{type(exc).__name__}: {exc}"}, "failed"
        detail = {**result, "repaired_by": repaired.detail.get("by", "")}
        detail["reason"] = _reason(status, result, "resumed: verify found it repaired and green")
        self.record({**row, "status": status, "detail": detail, "finished_at": now_ms()})
        emit(ActionEvent(VERIFY, status, node, "", txn, "" if status == "ok" else detail["reason"]))

    def _run(
        self, name: str, limit: str, extravars: dict[str, Any], untrusted: dict[str, Any], timeout: int
    ) -> dict[str, Any]:
        extravars = {
            "stethoscope_evidence_dir": str(
                self.ctx.setting("stethoscope_evidence_dir", self.ctx.state_dir / "evidence")
            ),
            **extravars,
            "stethoscope_remediate_execute": True,
        }
        envvars = playbook_environment(self.ctx.dsn, self.ctx.database, self.ctx.spool_dir)
        result = run_playbook(
            name,
            self.ctx.inventory.path,
            limit,
            extravars,
            envvars,
            timeout,
            untrusted or None,
            niceness=BACKGROUND_NICENESS,
        )
        return {
            "ok": result.ok,
            "rc": result.rc,
            "runner_status": result.status,
            "events": result.events,
            "failed_hosts": sorted(
                {*_counted(result.stats.get("failures")), *_counted(result.stats.get("dark"))}
            ),
            "ran_hosts": sorted(_counted(result.stats.get("ok"))),
        }


def verifies_due(ledger: Ledger, orphans: Orphans) -> list[tuple[str, str, ActionState]]:
    """(txn, node, its repaired row) of the incidents marked repaired since their last verify (or
    whose verify's executor died), whose drain still holds the node."""
    drains = {(d.txn_id, d.node) for d in ledger.drains() if d.status == "ok"}
    return _due(drains, ledger.action_states({txn for txn, _ in drains}) if drains else [], orphans)


def _due(
    drains: set[tuple[str, str]], states: list[ActionState], orphans: Orphans
) -> list[tuple[str, str, ActionState]]:
    """verifies_due from the drains holding their nodes and the action states of their txns."""
    verified = {(s.txn_id, s.target): s for s in states if s.action == VERIFY}
    due = []
    for state in states:
        key = (state.txn_id, state.target)
        if state.action != REPAIRED or state.status != "ok" or key not in drains:
            continue
        last = verified.get(key)
        dead = last is not None and last.status == RUNNING and orphans.orphaned(last, now_ms())
        if last is not None and last.started_ms >= state.started_ms and not dead:
            continue
        due.append((state.txn_id, state.target, state))
    return due


@dataclass(frozen=True)
class Outstanding:
    """What serve's /metrics shows of the work in progress: re-baselines not done, by status, and the
    verifies of incidents marked repaired whose verify has not finished (`due`, `running`)."""

    rebaselines: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(NOT_DONE, 0))
    verifies: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys((DUE, RUNNING), 0))


def outstanding(store: Store) -> Outstanding:
    """The re-baselines and verifies the ledger holds not done; every status present, at 0 if none."""
    ledger = Ledger(store)
    newest: dict[str, ActionState] = {}  # a node's last re-baseline: a later one ends a given-up one
    for state in latest_of(ledger, REBASELINE):
        if state.target not in newest or state.started_ms > newest[state.target].started_ms:
            newest[state.target] = state
    statuses = Counter(s.status for s in newest.values() if s.status in NOT_DONE)
    # a verify counts while its drain holds the node (a node resumed since is done with it)
    held = {(d.txn_id, d.node) for d in ledger.drains() if d.status == "ok"}
    states = ledger.action_states({txn for txn, _node in held}) if held else []
    due = {(txn, node) for txn, node, _repaired in _due(held, states, _NEVER)}
    # one whose executor died counts running until it runs again; repaired again since, it is due alone
    waiting = held - due
    running = sum(
        1 for s in states if s.action == VERIFY and s.status == RUNNING and (s.txn_id, s.target) in waiting
    )
    return Outstanding({**dict.fromkeys(NOT_DONE, 0), **statuses}, {DUE: len(due), RUNNING: running})


def _counted(per_host: Any) -> set[str]:
    return {str(host) for host, count in dict(per_host or {}).items() if count}


SKIPPED_BY_PREFLIGHT = re.compile(r"baseline preflight (?P<node>\S+): skipped: (?P<why>.*)")


def node_outcomes(nodes: list[str], result: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Each node's (status, why) of one batch: `waiting` for one the Slurm preflight skipped (a job on
    it, a drain not the baseline's), `failed` for one with a failed or unreachable task, or that never
    ran (the whole run cut off or raised), else `ok`."""
    skipped = {}
    for event in result.get("events", []):
        said = SKIPPED_BY_PREFLIGHT.match(str(event.get("msg", "")))
        if event.get("event") == "runner_on_ok" and said:
            skipped[said["node"]] = said["why"]
    failed, ran = set(result.get("failed_hosts", [])), set(result.get("ran_hosts", []))
    cut_off = bool(result.get("error")) or result.get("runner_status") not in ("successful", "failed")
    outcomes = {}
    for node in nodes:
        if node in skipped:
            outcomes[node] = (WAITING, f"skipped by baseline.yml's preflight: {skipped[node]}")
        elif cut_off or node in failed or node not in ran:
            outcomes[node] = ("failed", _reason("failed", _of_node(result, node), ""))
        else:
            outcomes[node] = ("ok", "")
    return outcomes


def _of_node(result: dict[str, Any], node: str) -> dict[str, Any]:
    events = [e for e in result.get("events", []) if e.get("host") == node]
    return {**result, "events": events}


def _reason(status: str, result: dict[str, Any], done: str) -> str:
    if status == "ok":
        return done
    if result.get("error"):
        return str(result["error"])
    failed = [
        e for e in result.get("events", []) if e.get("event") in ("runner_on_failed", "runner_on_unreachable")
    ]
    said = "; ".join(f"{e.get('host')}: {e.get('task')}: {e.get('msg')}" for e in failed[:3])
    return said or f"rc {result.get('rc')} ({result.get('runner_status')})"


def preview_entries(
    store: Store,
    context: Context,
    findings: list[dict[str, Any]],
    at_ms: int,
    breaker: CircuitBreaker | None = None,
    blocked: str = "",
) -> list[dict[str, Any]]:
    """`diagnose --plan`'s lines for re-baselines and verifies (read-only): planned, waiting (and
    why: the scheduler, the window, `blocked` (this cycle's drains for faults come first) or no room
    in `breaker`, the one `--execute` would arm now), running, and the verifies a repair mark makes due."""
    ledger = Ledger(store)
    hosts = list(context.inventory.hosts)
    why_wait = why_waiting(context) or blocked
    room = breaker or armed(store, context)

    def will_run(node: str) -> str:
        allowed, why = room.room(node)
        return why_wait or ("runs" if allowed else f"waiting for the breaker: {why}")

    planned = {s.txn_id: s for s in latest_of(ledger, REBASELINE)}
    entries = []
    for candidate in candidates(store, findings, hosts, at_ms, silencer(store, context)):
        if candidate.txn_id not in planned:
            said = will_run(candidate.node)
            entries.append(_entry(candidate.txn_id, candidate.node, REBASELINE, said, candidate.why, True))
    for state in planned.values():
        if state.status in (WAITING, RUNNING):
            will = "running" if state.status == RUNNING else will_run(state.target)
            entries.append(
                _entry(state.txn_id, state.target, REBASELINE, will, str(state.detail.get("why", "")), False)
            )
    for txn, node, repaired in verifies_due(ledger, _NEVER):
        entries.append(
            _entry(txn, node, VERIFY, "runs", f"marked repaired by {repaired.detail.get('by', '?')}", False)
        )
    return entries


def _entry(txn: str, node: str, label: str, will: str, why: str, new: bool) -> dict[str, Any]:
    return {
        "txn_id": txn,
        "node": node,
        "rule_id": HARDWARE_RULE if label == REBASELINE else "",
        "severity": "info",
        "new": False,
        "planned_now": new,
        "steps": [{"action": short_action(label), "label": label, "will": will, "why": why}],
    }


_NEVER = Orphans(None, lambda action: 1 << 62)


def repaired_row(txn_id: str, node: str, by: str, note: str) -> dict[str, Any]:
    """The `repaired` row of `stethoscope incidents repaired TXN`."""
    return note_row(txn_id, REPAIRED, node, {"by": by, "note": note})


_versions = {"last": 0}


def _write(ledger: Ledger, row: dict[str, Any]) -> None:
    """One row through the cycle's handle, each a version above the last (two in one ms stay ordered)."""
    version = max(now_ms(), _versions["last"] + 1)
    _versions["last"] = version
    ledger.write_action(row, version)
