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
from stethoscope.diagnosis.freshness import fresh_nodes
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


def decide(
    store: Store,
    findings: list[dict[str, Any]],
    rules: list[Rule],
    at_ms: int,
    hosts: Collection[str] | None = None,
    model_nodes: Collection[str] | None = None,
) -> tuple[list[Decision], list[tuple[dict[str, Any], str, int, int]], list[tuple[str, str, int]]]:
    """-> (what acts now, findings rows to write, (finding_id, status, version) of the others).
    `hosts`: the inventory evaluated; another inventory's findings in the same database are left as
    they are. `model_nodes`: the nodes the model saw data of this cycle (None: it did not run)."""
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
    others = _the_others(store, ledger, known, findings, rules, at_ms, hosts, model_nodes)
    return decisions, rows, others


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
) -> list[tuple[str, str, int]]:
    seen = {f["finding_id"] for f in findings}
    by_rule = {rule.rule_id: rule for rule in rules}
    silent = [
        k
        for k in known.values()
        if k.status != "resolved"
        and k.finding_id not in seen
        and (hosts is None or any(node in hosts for node in k.nodes))
    ]
    if not silent:
        return []
    drained = ledger.drained_txns()
    changes: list[tuple[str, str, int]] = []
    pending: dict[str, list[KnownFinding]] = {}
    for k in silent:
        if k.txn_id in drained:
            continue  # its node stays drained until verify resumes it, whatever the data does
        if k.rule_id.startswith("unknown."):
            changes.append((k.finding_id, "resolved", _version(k)))  # the data came back
        elif k.rule_id.startswith("model."):
            if model_nodes is not None:
                status = "resolved" if k.node_id in model_nodes else "stale"
                if status != k.status:
                    changes.append((k.finding_id, status, _version(k)))
        elif k.rule_id in by_rule:
            pending.setdefault(k.rule_id, []).append(k)
    for rule_id, silenced in pending.items():
        fresh = fresh_nodes(store, by_rule[rule_id], {k.node_id for k in silenced}, at_ms)
        for k in silenced:
            status = "resolved" if k.node_id in fresh else "stale"
            if status != k.status:
                changes.append((k.finding_id, status, _version(k)))
    return changes
