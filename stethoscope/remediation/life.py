"""The life of a finding (docs/design.md "Rules"): which matches open a transaction and act, which only
keep their finding open, and what becomes of the findings that stopped matching.

- `open` while the rule matches; matching again acts no more (one transaction, ticket, drain).
- A family's findings on one (node, device) share a transaction; a more severe member escalates it
  and runs only the actions the transaction has not taken yet.
- The cooldown holds only a finding resolved and matching again (flapping): it re-opens under its
  old transaction and does not act.
- A finding that stops matching is `resolved` when fresh data says so, `stale` when the data
  stopped; one whose transaction holds a drain stays open until verify resumes the node. A model
  finding resolves when the model saw its node's data this cycle and found nothing, is stale when
  it saw none, and stays as it is when the model did not run (--no-model).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from stethoscope.diagnosis.diagnose import SEVERITY_ORDER, action_label
from stethoscope.diagnosis.hysteresis import HELD, Held, held_reason, settle_all
from stethoscope.diagnosis.rules import Action, Rule
from stethoscope.remediation.ledger import KnownFinding, Ledger
from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms

# run again when a family escalates: under the same txn (their idempotency key) they update the one
# ticket instead of opening another
UPDATES = ("playbook:remediate/ticket.yml", "api_call")


def new_txn_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class Decision:
    finding: dict[str, Any]
    actions: tuple[Action, ...]
    escalation: dict[str, Any] | None = None  # from, to, rule: a family member raised the severity


@dataclass
class _FamilyTxn:
    txn_id: str
    first_seen_ms: int
    severity: str


def _version(known: KnownFinding | None) -> int:
    return max(now_ms(), known.version + 1 if known else 0)


@dataclass
class Plan:
    decisions: list[Decision]  # what acts now
    rows: list[tuple[dict[str, Any], str, int, int]]  # findings rows to write
    changes: list[tuple[str, str, int]]  # (finding_id, status, version) of the findings that did not match
    held: list[Held]  # of those, the ones still open: reported with this cycle's findings


def decide(
    store: Store,
    findings: list[dict[str, Any]],
    rules: list[Rule],
    at_ms: int,
    hosts: Collection[str] | None = None,
    model_nodes: Collection[str] | None = None,
) -> Plan:
    """What the matched findings do, and what becomes of the others. `rules` as fitted to the
    cadence (diagnosis.cadence). `hosts`: the inventory evaluated; another inventory's findings in
    the same database are left as they are. `model_nodes`: the nodes the model saw data of this
    cycle (None: it did not run)."""
    ledger = Ledger(store)
    known = ledger.known_findings()
    family_of = {rule.rule_id: rule.family for rule in rules}
    families: dict[tuple[str, str, str], _FamilyTxn] = {}
    for member in sorted(known.values(), key=lambda m: m.first_seen_ms):
        family = family_of.get(member.rule_id)
        if family and member.status != "resolved":
            entry = families.setdefault(
                (family, member.node_id, member.device),
                _FamilyTxn(member.txn_id, member.first_seen_ms, member.severity),
            )
            if SEVERITY_ORDER[member.severity] > SEVERITY_ORDER[entry.severity]:
                entry.severity = member.severity
    decisions: list[Decision] = []
    rows: list[tuple[dict[str, Any], str, int, int]] = []
    for finding in findings:  # most severe first: of a family new at once, the worst one acts
        k = known.get(finding["finding_id"])
        family = family_of.get(finding["rule_id"])
        key = (family, finding["node_id"], finding["device"]) if family else None
        if k is not None and k.status != "resolved":
            _keep(
                finding, k.txn_id, k.first_seen_ms, f"open since {iso(k.first_seen_ms)} under txn {k.txn_id}"
            )
        elif k is not None and at_ms - k.last_seen_ms < finding["cooldown_seconds"] * 1000:
            _keep(
                finding,
                k.txn_id,
                k.first_seen_ms,
                f"cooldown: re-opened under txn {k.txn_id}, resolved after {iso(k.last_seen_ms)}",
            )
        elif key is not None and key in families:
            entry = families[key]
            finding.update(txn_id=entry.txn_id, first_seen_ms=entry.first_seen_ms, outcome="")
            if SEVERITY_ORDER[finding["severity"]] > SEVERITY_ORDER[entry.severity]:
                taken = ledger.actions_of_txn(entry.txn_id)
                new = tuple(
                    a for a in finding["plan"] if action_label(a) not in taken or action_label(a) in UPDATES
                )
                escalation = {
                    "from": entry.severity,
                    "to": finding["severity"],
                    "rule_id": finding["rule_id"],
                }
                decisions.append(Decision(finding, new, escalation))
                entry.severity = finding["severity"]
            else:
                finding["outcome"] = f"family {family}: joins txn {entry.txn_id}, no new action"
        else:
            finding.update(txn_id=new_txn_id(), first_seen_ms=at_ms, outcome="")
            decisions.append(Decision(finding, tuple(finding["plan"])))
            if key is not None:
                families[key] = _FamilyTxn(finding["txn_id"], at_ms, finding["severity"])
        finding["first_seen"] = iso(finding["first_seen_ms"])
        rows.append((finding, "open", _version(k), at_ms))
    changes, held = _the_others(store, ledger, known, findings, rules, at_ms, hosts, model_nodes)
    return Plan(decisions, rows, changes, held)


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
        and (hosts is None or any(node in hosts for node in k.nodes))
    ]
    if not silent:
        return [], []
    drained = ledger.drained_txns()
    changes: list[tuple[str, str, int]] = []
    held: list[Held] = []
    pending: list[KnownFinding] = []
    for k in silent:
        if k.txn_id in drained:  # its node stays drained until verify resumes it, whatever the data does
            held.append(
                Held(k.previous(), f"drained under txn {k.txn_id}: open until verify resumes the node")
            )
        elif k.rule_id.startswith("unknown."):
            changes.append((k.finding_id, "resolved", _version(k)))  # the data came back
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
        status = "open" if verdict == HELD else verdict
        if status != k.status:
            changes.append((k.finding_id, status, _version(k)))
        if verdict == HELD:
            held.append(Held(k.previous(), held_reason(k.previous(), rules)))
    return changes, held
