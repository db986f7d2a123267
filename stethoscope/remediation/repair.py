"""Resume only when repaired (docs/design.md "Remediation safety"): whose drain it is, what still
matches on the node, and the node resumed without repair.

- Ownership, checked before any benchmark: the actions table holds stethoscope's drain of the node
  under the transaction, and Slurm shows the node drained with that drain's reason
  (`stethoscope: <rule> <txn>`). A node a person drained, or drained under another transaction, is
  refused at once with what to do.
- Still matching: the rules evaluated now for that node alone; any finding of warning or worse
  keeps it drained, however green its benchmarks.
- Fresh data: every metric of the incident's rule has a sample of the node newer than the drain and
  inside its condition's window now; a rule with no sample reads "not matching", which proves
  nothing, so without one the node stays drained until it is swept again.
- Resumed without repair: a finding whose transaction verify resumed matches again within
  RECHECK_MS of the resume. It opens a new transaction as a critical escalation that drains and
  alerts again, even though its first transaction had drained once; the escalation's actions row
  says "resumed without repair" and names the transaction that was resumed.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.levels import SEVERITY_ORDER, action_label
from stethoscope.diagnosis.rules import Action, Rule
from stethoscope.remediation.ledger import DRAIN, RESUME, KnownFinding, Ledger
from stethoscope.remediation.slurm_state import read_nodes
from stethoscope.store.client import Store

RESUMED_WITHOUT_REPAIR = "resumed without repair"
ANY_METRIC = "any metric"  # the incident's rule is not loaded: any sample of the node will do
RECHECK_MS = 7 * 24 * 3600_000  # a match within a week of the resume is the same fault, not a new one
DRAIN_ACTION = Action("playbook", (("playbook", DRAIN.removeprefix("playbook:")),))


@dataclass
class Ownership:
    """Is the node's drain stethoscope's, under this transaction? `reasons` and `todo` say why not."""

    owned: bool
    rule_id: str
    drained_at_ms: int | None
    slurm_reason: str | None  # None: Slurm could not be asked
    reasons: list[str] = field(default_factory=list)
    todo: str = ""


def ownership(
    store: Store, node: str, slurm_name: str, txn_id: str, environment: dict[str, str] | None = None
) -> Ownership:
    """The drain of `node` under `txn_id`, in the actions table and in Slurm."""
    ledger = Ledger(store)
    drained_at = ledger.drain_of(node, txn_id)
    rule_id = ledger.rule_of_txn(txn_id)
    slurm = read_nodes(environment)
    shown = slurm.get(slurm_name) if slurm is not None else None
    reason = shown.reason if shown is not None else None
    result = Ownership(False, rule_id, drained_at, reason)
    expected = f"stethoscope: {rule_id or '<rule>'} {txn_id}"
    if drained_at is None:
        result.reasons.append(f"no drain of {node} recorded under txn {txn_id}")
        result.todo = (
            f"check the txn: `stethoscope actions` lists stethoscope's drains; if a person drained "
            f"{node}, they resume it (scontrol update nodename={slurm_name} state=resume)"
        )
    if slurm is None:
        result.reasons.append("Slurm could not be asked (scontrol -o show node): the drain is unconfirmed")
        result.todo = (
            result.todo or "run verify where scontrol reaches slurmctld (stethoscope_slurm_environment)"
        )
    elif shown is None:
        result.reasons.append(f"Slurm has no node {slurm_name}")
        result.todo = result.todo or f"set slurm_name of {node} in the inventory to its Slurm name"
    elif not shown.out_of_service:
        result.reasons.append(f"{slurm_name} is not drained in Slurm: nothing to resume")
        result.todo = result.todo or "someone resumed it already; nothing for verify to do"
    elif reason is None or reason.split()[:3] != expected.split():
        result.reasons.append(
            f"{slurm_name} is drained in Slurm with reason {reason!r}, not stethoscope's {expected!r}"
        )
        result.todo = (
            f"a person or another transaction drained {node}: whoever drained it resumes it "
            f"(scontrol update nodename={slurm_name} state=resume); verify resumes only its own drain"
        )
    result.owned = not result.reasons
    return result


def still_matching(store: Store, rules: list[Rule], node: str, at_ms: int) -> list[dict[str, Any]]:
    """The findings of warning or worse on `node` at `at_ms`, from the rules evaluated for it alone."""
    floor = SEVERITY_ORDER["warning"]
    return [
        f
        for f in diagnose(store, rules, at_ms, nodes=[node])
        if f["node_id"] == node and SEVERITY_ORDER[f["severity"]] >= floor
    ]


def stale_metrics(
    store: Store, rules: list[Rule], rule_id: str, node: str, drained_at_ms: int, at_ms: int
) -> list[str]:
    """The metrics of the incident's rule (any metric when the rule is not loaded) of which `node` has
    no sample both newer than the drain and inside the condition's window at `at_ms`: without one the
    rule reads "not matching" for want of data, which says nothing about the repair."""
    rule = next((r for r in rules if r.rule_id == rule_id), None)
    windows: dict[str, int] = {}
    for condition in rule.conditions if rule is not None else ():
        window_ms = condition.window_seconds * 1000
        windows[condition.metric] = min(windows.get(condition.metric, window_ms), window_ms)
    rows = store.query(
        f"SELECT metric_name, toUnixTimestamp64Milli(max(timestamp)) FROM {store.database}.metrics "
        "WHERE node_id = {node:String} AND timestamp > fromUnixTimestamp64Milli({after:Int64}, 'UTC') "
        "AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') GROUP BY metric_name",
        {"node": node, "after": drained_at_ms, "at": at_ms},
    )
    newest = {str(metric): int(ms) for metric, ms in rows}
    if not windows:
        return [] if newest else [ANY_METRIC]
    return sorted(
        m for m, window_ms in windows.items() if newest.get(m, 0) <= max(drained_at_ms, at_ms - window_ms)
    )


def resumed_txns(store: Store, txn_ids: Collection[str]) -> dict[str, int]:
    """Of these transactions, those verify resumed, with when (ms)."""
    if not txn_ids:
        return {}
    return {
        state.txn_id: state.started_ms
        for state in Ledger(store).action_states(txn_ids)
        if state.action == RESUME and state.status == "ok"
    }


def unrepaired(known: KnownFinding | None, resumed: dict[str, int], at_ms: int) -> bool:
    """A resolved finding matching again soon after verify resumed its transaction's node."""
    if known is None or known.status != "resolved" or known.txn_id not in resumed:
        return False
    return at_ms - resumed[known.txn_id] <= RECHECK_MS


def reisolation(finding: dict[str, Any], known: KnownFinding) -> tuple[tuple[Action, ...], dict[str, Any]]:
    """The actions (its plan with a drain, whatever its level, and an alert saying so) and the
    escalation of a finding whose node was resumed without repair; `finding` becomes critical."""
    plan = tuple(a for a in finding["plan"] if action_label(a) != "alert")
    message = (
        f"{{{{ node_id }}}} {RESUMED_WITHOUT_REPAIR}: {{{{ rule_id }}}} matches again after verify "
        f"resumed it under txn {known.txn_id}; isolating it again under txn {{{{ txn_id }}}}"
    )
    alert = Action("alert", (("message", message),))
    drain = () if DRAIN in {action_label(a) for a in plan} else (DRAIN_ACTION,)
    actions = (alert, *plan, *drain)  # the person hears of it first: a drain can take a while
    escalation = {
        "from": known.severity,
        "to": "critical",
        "rule_id": finding["rule_id"],
        "reason": RESUMED_WITHOUT_REPAIR,
        "resumed_txn": known.txn_id,
    }
    finding["severity"] = "critical"
    return actions, escalation
