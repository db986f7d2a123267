"""The life of a finding (docs/design.md "Rules"): which matches open a transaction and act, which only
keep their finding open, and what becomes of the findings that stopped matching.

- `open` while the rule matches; matching again acts no more (one transaction, ticket, drain).
- A transaction is an incident (remediation/incidents.py): a new finding on the node and device of
  an open incident, or of its rule's family, joins it and runs only the actions of its plan the
  incident has not taken yet (by label; `log` for every finding); one more severe than the
  incident escalates it, and the ticket and api_call run again under the same txn (their
  idempotency key), updating the one ticket.
- Failed or expired actions of open incidents are retried after a backoff, a refused drain when the
  circuit breaker has room (remediation/retries.py); past the last retry the incident needs a
  person. A drain is retried only while a finding of its incident matches this cycle: a finding
  held open or stale is no reason to take a node out now. Tickets, alerts, api_calls, evidence
  and logs are retried while the incident is open: whoever is told should hear of it either way.
- The cooldown holds only a finding resolved and matching again (flapping): it re-opens under its
  old transaction and does not act.
- A finding a silence or maintenance holds (remediation.silences) is `silenced`: no action, none of
  its actions retried; once released it acts as a new one would, or, silenced under an open
  incident, rejoins it (its start kept) and runs only what that incident has not taken. An
  acknowledged incident's retries and alerts wait until it escalates or is un-acknowledged
  (remediation.ack).
- A finding that stops matching is `resolved` when fresh data says so, `stale` when the data
  stopped; one whose transaction holds a drain stays open until verify resumes the node. One that
  matches again within a week of verify's resume was resumed without repair (remediation/repair.py):
  a new transaction, critical, that alerts and drains again. A model
  finding resolves when the model saw its node's data this cycle and found nothing, is stale when
  it saw none, and stays as it is when the model did not run (--no-model).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from stethoscope.catalog import Catalog, default_catalog
from stethoscope.diagnosis.findings import RULE_FAILED, held_finding
from stethoscope.diagnosis.hysteresis import HELD, Held, held_reason, settle_all
from stethoscope.diagnosis.job_watch import HUNG_RULE
from stethoscope.diagnosis.levels import SEVERITY_ORDER, action_label
from stethoscope.diagnosis.rules import Action, Rule
from stethoscope.remediation.ack import paused_txns
from stethoscope.remediation.incidents import DEFAULT_WINDOW_SECONDS, Incident, OpenIncidents
from stethoscope.remediation.ledger import DRAIN, ActionState, KnownFinding, Ledger
from stethoscope.remediation.repair import reisolation, resumed_txns, unrepaired
from stethoscope.remediation.retries import Backoff, due, exhausted
from stethoscope.remediation.silences import SILENCED
from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms

# run again when an incident escalates: under the same txn (their idempotency key) they update the
# one ticket instead of opening another
UPDATES = ("playbook:remediate/ticket.yml", "api_call")
PER_FINDING = ("log",)  # runs for every finding that joins an incident


def new_txn_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Decision:
    finding: dict[str, Any]
    actions: tuple[Action, ...]
    escalation: dict[str, Any] | None = None  # from, to, rule: a more severe finding joined the incident
    joined: str = ""  # why it joined an open incident ("family F", "same device gpu2"); "" it opened one


@dataclass
class Retry:
    """The next attempt of an action of an open incident (remediation/retries.py)."""

    finding: dict[str, Any]
    action: Action
    earlier: ActionState

    @property
    def node(self) -> str:
        return self.earlier.target or self.finding["node_id"]


def _version(known: KnownFinding | None) -> int:
    return max(now_ms(), known.version + 1 if known else 0)


@dataclass
class Plan:
    decisions: list[Decision]  # what acts now
    rows: list[tuple[dict[str, Any], str, int, int]]  # findings rows to write
    changes: list[tuple[str, str, int]]  # (finding_id, status, version) of the findings that did not match
    held: list[Held]  # of those, the ones still open: reported with this cycle's findings
    retries: list[Retry] = field(default_factory=list)  # actions of open incidents due again
    # txn -> the actions past their last retry, with their findings (as matched now, else as stored)
    exhausted: dict[str, list[tuple[dict[str, Any], ActionState]]] = field(default_factory=dict)
    states: list[ActionState] = field(default_factory=list)  # the open incidents' actions, before this cycle
    open_txns: set[str] = field(default_factory=set)  # the open incidents after this cycle

    def drains(self) -> list[str]:
        """The nodes this cycle drains, in the order the circuit breaker gives them room (`admit`):
        the decisions' (the worst findings first), then the drains due again."""
        new = [d.finding["node_id"] for d in self.decisions for a in d.actions if action_label(a) == DRAIN]
        return new + [r.node for r in self.retries if r.earlier.action == DRAIN]


def _order(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Device findings before node-level ones (which join them), then the most severe first, and of
    equal severity the higher level: of an incident new at once, its worst finding opens it."""

    def level(finding: dict[str, Any]) -> int:
        text = str(finding.get("level") or "")
        return int(text[1:]) if text[1:].isdigit() else 0

    return sorted(findings, key=lambda f: (not f["device"], -SEVERITY_ORDER[f["severity"]], -level(f)))


def decide(
    store: Store,
    findings: list[dict[str, Any]],
    rules: list[Rule],
    at_ms: int,
    hosts: Collection[str] | None = None,
    model_nodes: Collection[str] | None = None,
    *,
    window_ms: int = DEFAULT_WINDOW_SECONDS * 1000,
    backoff: Backoff | None = None,
    catalog: Catalog | None = None,
    quiet: Callable[[dict[str, Any]], str | None] | None = None,
) -> Plan:
    """What the matched findings do, and what becomes of the others. `rules` as fitted to the
    cadence (diagnosis.cadence). `hosts`: the inventory evaluated; another inventory's findings in
    the same database are left as they are. `model_nodes`: the nodes the model saw data of this
    cycle (None: it did not run). `window_ms`: how long after its latest finding an incident is
    joined by new ones; `backoff`: the retries of failed actions; `quiet`: what silences a finding
    that did not match now (silence_table.silencer), so that its incident retries nothing."""
    ledger = Ledger(store)
    known = ledger.known_findings()
    resumed = resumed_txns(  # a node verify resumed that matches again: resumed without repair
        store, {known[f["finding_id"]].txn_id for f in findings if f["finding_id"] in known}
    )
    family_of = {rule.rule_id: rule.family or "" for rule in rules}
    incidents = OpenIncidents(catalog or default_catalog(), window_ms)
    for member in sorted(known.values(), key=lambda m: m.first_seen_ms):
        # a dry run's finding (no txn) is no incident, nor one a silence holds
        if member.status not in ("resolved", SILENCED) and member.txn_id:
            incidents.add(
                member.txn_id,
                member.rule_id,
                member.node_id,
                member.device,
                member.severity,
                member.last_seen_ms,
                family_of.get(member.rule_id, ""),
            )
    released = {  # silenced under an open incident, matched now unsilenced: it rejoins that incident
        known[f["finding_id"]].txn_id
        for f in findings
        if not f.get("silenced") and _released(known.get(f["finding_id"]))
    }
    txns = set(incidents.by_txn) | released
    states = ledger.action_states(txns) if txns else []
    taken: dict[str, set[str]] = {}
    for state in states:
        taken.setdefault(state.txn_id, set()).add(state.action)
    decisions: list[Decision] = []
    rows: list[tuple[dict[str, Any], str, int, int]] = []
    for finding in _order(findings):
        k = known.get(finding["finding_id"])
        family = family_of.get(finding["rule_id"], "")
        if finding.get("silenced"):  # remediation.silences: recorded as silenced, no action
            rows.append(_silenced(finding, k, at_ms))
            continue
        # a dry run's, or one a silence held outside any incident: it acts as a new one would
        dry = k if k is not None and (not k.txn_id or k.status == SILENCED) and not _released(k) else None
        if dry is not None:
            k = None  # new to the executor: it opens an incident and acts
        if k is not None and _released(k):  # back in its incident: only what it has not taken runs
            finding.update(txn_id=k.txn_id, first_seen_ms=k.first_seen_ms, outcome="")
            done = taken.setdefault(k.txn_id, set())
            actions = tuple(a for a in finding["plan"] if action_label(a) not in done)
            done.update(action_label(a) for a in actions)
            if actions:
                decisions.append(Decision(finding, actions, joined=f"released from silence, txn {k.txn_id}"))
            else:
                since = iso(k.first_seen_ms)
                finding["outcome"] = (
                    f"released from silence, open since {since} under txn {k.txn_id}: no new action"
                )
        elif k is not None and k.status != "resolved":
            _keep(
                finding, k.txn_id, k.first_seen_ms, f"open since {iso(k.first_seen_ms)} under txn {k.txn_id}"
            )
        elif k is not None and unrepaired(k, resumed, at_ms):  # isolated again, under a new txn
            actions, escalation = reisolation(finding, k)
            finding.update(first_seen_ms=at_ms, outcome="", txn_id=new_txn_id())
            decisions.append(Decision(finding, actions, escalation))
            taken[finding["txn_id"]] = {action_label(a) for a in actions}
        elif k is not None and at_ms - k.last_seen_ms < finding["cooldown_seconds"] * 1000:
            _keep(
                finding,
                k.txn_id,
                k.first_seen_ms,
                f"cooldown: re-opened under txn {k.txn_id}, resolved after {iso(k.last_seen_ms)}",
            )
        else:
            found = incidents.find(finding["rule_id"], finding["node_id"], finding["device"], family, at_ms)
            ongoing = dry is not None and dry.status != "resolved"  # seen since then, acted on now
            finding.update(first_seen_ms=dry.first_seen_ms if dry and ongoing else at_ms, outcome="")
            if found is None:
                finding["txn_id"] = new_txn_id()
                decisions.append(Decision(finding, tuple(finding["plan"])))
                taken[finding["txn_id"]] = {action_label(a) for a in finding["plan"]}
            else:
                incident, why = found
                decision = _join(finding, incident, taken.setdefault(incident.txn_id, set()), why)
                if decision.actions or decision.escalation:
                    decisions.append(decision)
                else:
                    finding["outcome"] = f"joins incident {incident.txn_id} ({why}): no new action"
        incidents.add(
            finding["txn_id"],
            finding["rule_id"],
            finding["node_id"],
            finding["device"],
            finding["severity"],
            at_ms,
            family,
        )
        finding["first_seen"] = iso(finding["first_seen_ms"])
        rows.append((finding, "open", _version(k or dry), at_ms))
    changes, held = _the_others(store, ledger, known, findings, rules, at_ms, hosts, model_nodes)
    resolved = {finding_id for finding_id, status, _ in changes if status == "resolved"}
    open_txns = {f["txn_id"] for f in findings if not f.get("silenced")} | {
        k.txn_id
        for k in known.values()
        if k.status not in ("resolved", SILENCED)
        and k.txn_id
        and k.finding_id not in resolved
        and (hosts is None or any(node in hosts for node in k.nodes))
    }
    # an acknowledged incident's retries and alerts wait for its person, until it escalates
    paused = paused_txns(states) - {d.finding["txn_id"] for d in decisions if d.escalation}
    for decision in decisions:
        if decision.finding["txn_id"] in paused:
            decision.actions = tuple(a for a in decision.actions if a.type != "alert")
    plan = Plan(decisions, rows, changes, held, states=states, open_txns=open_txns)
    _retries(plan, findings, known, rules, at_ms, backoff or Backoff(), paused, quiet)
    return plan


def _silenced(
    finding: dict[str, Any], k: KnownFinding | None, at_ms: int
) -> tuple[dict[str, Any], str, int, int]:
    """The row of a finding a silence or maintenance holds: under the txn of its open incident if it
    had one, first seen when that incident began (when the silence began to hold it otherwise)."""
    txn = k.txn_id if k is not None and k.status != "resolved" else ""
    ongoing = k is not None and (k.status == SILENCED or bool(txn))  # its incident's start is kept
    finding.update(txn_id=txn, first_seen_ms=k.first_seen_ms if k is not None and ongoing else at_ms)
    finding["first_seen"] = iso(finding["first_seen_ms"])
    finding.setdefault("outcome", f"silenced by {finding['silenced']}: no action")
    return finding, SILENCED, _version(k), at_ms


def _released(k: KnownFinding | None) -> bool:
    """A finding a silence held under its open incident's txn (a verify resume would have resolved it)."""
    return k is not None and k.status == SILENCED and bool(k.txn_id)


def _join(finding: dict[str, Any], incident: Incident, taken: set[str], why: str) -> Decision:
    """A new finding joins an open incident: only what the incident has not done yet runs, `log`
    for each finding, and the ticket and api_call again when it raises the incident's severity."""
    finding["txn_id"] = incident.txn_id
    rises = incident.worse(finding["severity"])
    actions = tuple(
        a
        for a in finding["plan"]
        if action_label(a) in PER_FINDING
        or action_label(a) not in taken
        or (rises and action_label(a) in UPDATES)
    )
    taken.update(action_label(a) for a in actions)
    escalation = None
    if rises:
        escalation = {"from": incident.severity, "to": finding["severity"], "rule_id": finding["rule_id"]}
        incident.severity = finding["severity"]
    return Decision(finding, actions, escalation, joined=why)


def _retries(
    plan: Plan,
    findings: list[dict[str, Any]],
    known: dict[str, KnownFinding],
    rules: list[Rule],
    at_ms: int,
    backoff: Backoff,
    paused: Collection[str] = (),
    quiet: Callable[[dict[str, Any]], str | None] | None = None,
) -> None:
    """The actions of open incidents due for their next attempt, each with its finding (as matched
    now, else as stored) and its action from the finding's plan; and those past their last retry.
    A drain only while a finding of its incident matches this cycle. None of an incident `paused`
    (acknowledged), nor of one with a finding silenced now: matched and marked, or, one that did not
    match, as `quiet` says (its node in maintenance or under a silence)."""
    matched = {f["finding_id"]: f for f in findings}
    silenced_txns = {f["txn_id"] for f in findings if f.get("silenced") and f.get("txn_id")}
    for s in plan.states:
        if s.txn_id in plan.open_txns and s.txn_id not in silenced_txns and s.finding_id not in matched:
            stored = _stored(known.get(s.finding_id), rules) if quiet is not None else None
            if stored is not None and quiet is not None and quiet(stored):
                silenced_txns.add(s.txn_id)
    states = [
        s
        for s in plan.states
        if s.txn_id in plan.open_txns and s.txn_id not in paused and s.txn_id not in silenced_txns
    ]
    matching = {f["txn_id"] for f in findings if not f.get("silenced")}
    for state in due(states, at_ms, backoff):
        if state.action == DRAIN and state.txn_id not in matching:
            continue
        finding = matched.get(state.finding_id) or _stored(known.get(state.finding_id), rules)
        action = (
            next((a for a in finding["plan"] if action_label(a) == state.action), None) if finding else None
        )
        if finding is not None and action is not None:
            plan.retries.append(Retry(finding, action, state))
    for state in states:
        if exhausted(state, backoff):
            finding = matched.get(state.finding_id) or _stored(known.get(state.finding_id), rules)
            if finding is not None:
                plan.exhausted.setdefault(state.txn_id, []).append((finding, state))


def _stored(known: KnownFinding | None, rules: list[Rule]) -> dict[str, Any] | None:
    """A finding that did not match this cycle, shaped for its actions (its rule's plan, or its
    level's when the rule is gone), its values from its evidence."""
    if known is None:
        return None
    finding = held_finding(Held(known.previous(), ""), rules)
    try:
        evidence = json.loads(known.evidence)
    except ValueError:
        evidence = {}
    values = (
        {k: v for k, v in evidence.items() if isinstance(v, int | float)}
        if isinstance(evidence, dict)
        else {}
    )
    finding.update(values=values, value=next(iter(values.values()), 0.0))
    return finding


def _keep(finding: dict[str, Any], txn_id: str, first_seen_ms: int, why: str) -> None:
    finding.update(txn_id=txn_id, first_seen_ms=first_seen_ms, outcome=f"{why}: no new action")


def _the_others(
    store: Store,
    ledger: Ledger,
    known: dict[str, KnownFinding],
    findings: list[dict[str, Any]],
    rules: list[Rule],
    at_ms: int,
    hosts: Collection[str] | None,
    model_nodes: Collection[str] | None = None,
) -> tuple[list[tuple[str, str, int]], list[Held]]:
    """(finding_id, status, version) of the known findings that did not match and change status,
    and those held open (hysteresis.settle; a drained node's until verify resumes it)."""
    seen = {f["finding_id"] for f in findings}
    silent = [
        k
        for k in known.values()
        if k.status != "resolved"
        and k.finding_id not in seen
        and (hosts is None or k.rule_id == RULE_FAILED or any(node in hosts for node in k.nodes))
    ]
    if not silent:
        return [], []
    return settle_silent(store, silent, rules, at_ms, model_nodes, ledger.drained_txns())


def settle_silent(
    store: Store,
    silent: list[KnownFinding],
    rules: list[Rule],
    at_ms: int,
    model_nodes: Collection[str] | None,
    drained: Collection[str] = (),
) -> tuple[list[tuple[str, str, int]], list[Held]]:
    """Of the known findings that did not match now: (finding_id, status, version) of those whose
    status changes (resolved on fresh clear data, stale when it stopped), and those held open
    (hysteresis.settle; the findings of a drained txn until verify resumes its node). Executing
    cycles settle their incidents' findings with it, dry runs (remediation.record) their own."""
    changes: list[tuple[str, str, int]] = []
    held: list[Held] = []
    pending: list[KnownFinding] = []
    for k in silent:
        if k.txn_id and k.txn_id in drained:  # its node stays drained until verify resumes it
            held.append(
                Held(k.previous(), f"drained under txn {k.txn_id}: open until verify resumes the node")
            )
        elif k.rule_id.startswith("unknown.") or k.rule_id in (RULE_FAILED, HUNG_RULE):
            # the data came back, the rule ran, the job reports again or has freed its GPUs
            changes.append((k.finding_id, "resolved", _version(k)))
        elif k.rule_id.startswith("model."):
            if model_nodes is not None:
                status = "resolved" if k.node_id in model_nodes else "stale"
                if status != k.status:
                    changes.append((k.finding_id, status, _version(k)))
        else:
            pending.append(k)
    verdicts = settle_all(store, rules, [k.previous() for k in pending], at_ms)
    for k in pending:
        verdict = verdicts.get(k.finding_id)
        if verdict is None:
            continue  # a rule no longer loaded: left as it is
        status = (SILENCED if k.status == SILENCED else "open") if verdict == HELD else verdict
        if status != k.status:
            changes.append((k.finding_id, status, _version(k)))
        if verdict == HELD:
            held.append(Held(k.previous(), held_reason(k.previous(), rules)))
    return changes, held
