"""The plan before acting (`diagnose --plan`, serve's first executing cycle): per incident, what
`--execute` would do now — drain, ticket, evidence, alert, log, api_call; a drain the circuit breaker
would refuse, and why; a finding silenced; one whose incident already did its actions; a retry due;
an incident past its last retry that needs a person; the re-baselines planned or waiting for their
window and the verifies a repair mark makes due (remediation.rebaseline). Built from the finding's life
(remediation.life `decide`) and the breaker armed read-only: it writes nothing, runs nothing and
holds no executor lock (a drain's permit is reserved in memory only, so that the plan's later
drains count the earlier ones)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from stethoscope.diagnosis.levels import action_label
from stethoscope.diagnosis.rules import Rule
from stethoscope.remediation.action_events import short_action
from stethoscope.remediation.breaker_state import armed
from stethoscope.remediation.ledger import DRAIN, NEEDS_PERSON
from stethoscope.remediation.life import decide
from stethoscope.remediation.rebaseline import preview_entries as upkeep_preview
from stethoscope.remediation.retries import REFUSED, next_attempt
from stethoscope.remediation.settings import Settings
from stethoscope.remediation.silence_table import drains_held, silencer
from stethoscope.store.client import Store
from stethoscope.terminal import terminal_safe_data

# what a step of the plan says
RUNS, REFUSED_BY_BREAKER, SILENCED, DONE, RETRY_DUE, NEEDS_A_PERSON = (
    "runs",
    "refused by the breaker",
    "silenced",
    "already done",
    "retry due",
    "needs a person",
)


def preview(
    store: Store,
    context: Any,
    findings: list[dict[str, Any]],
    rules: list[Rule],
    at_ms: int,
    model_nodes: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """Per incident (or silenced finding): its node, rule, txn and the steps `--execute` would take
    now, each {action, will, why}. `context`: the executor's (remediation.executor.Context);
    `findings`: the matched ones (not those held open), `rules` as fitted to the cadence."""
    settings = Settings.of(context)
    hosts = context.inventory.hosts
    matched = [dict(f) for f in findings if not f.get("held")]  # decide() annotates its findings
    plan = decide(
        store,
        matched,
        rules,
        at_ms,
        hosts,
        model_nodes=model_nodes,
        window_ms=settings.window_ms,
        backoff=settings.backoff,
        quiet=silencer(store, context),
    )
    breaker = armed(store, context)  # read-only, as the executor's would be now
    admitted = breaker.admit(plan.drains())  # in the order the executor's breaker gives room
    held = drains_held(context)  # as the executor holds them: Alertmanager's silences unread
    if held:
        admitted = dict.fromkeys(admitted, (False, held))
    incidents: dict[str, dict[str, Any]] = {}

    def incident(finding: dict[str, Any], txn: str) -> dict[str, Any]:
        key = txn or finding["finding_id"]
        return incidents.setdefault(
            key,
            {
                "txn_id": txn,
                "node": finding["node_id"],
                "rule_id": finding["rule_id"],
                "device": finding["device"],
                "severity": finding["severity"],
                "new": False,
                "steps": [],
            },
        )

    def step(entry: dict[str, Any], label: str, node: str, will: str = RUNS, why: str = "") -> None:
        if will in (RUNS, RETRY_DUE) and label == DRAIN:
            allowed, reason = admitted.get(node, (True, ""))
            will, why = (will, why) if allowed else (REFUSED_BY_BREAKER, reason)
        entry["steps"].append({"action": short_action(label), "label": label, "will": will, "why": why})

    decided = {d.finding["finding_id"] for d in plan.decisions}
    for decision in plan.decisions:
        finding = decision.finding
        entry = incident(finding, finding["txn_id"])
        entry["new"] = entry["new"] or not decision.joined
        for action in decision.actions:
            rises = decision.escalation
            why = f"escalates {rises['from']} -> {rises['to']}" if rises else decision.joined
            step(entry, action_label(action), finding["node_id"], why=why)
    for retry in plan.retries:
        earlier = retry.earlier
        entry = incident(retry.finding, earlier.txn_id)
        node = retry.node
        if earlier.status == REFUSED and earlier.action == DRAIN:
            step(entry, earlier.action, node, why="refused before; the breaker has room now")
        else:
            why = f"attempt {next_attempt(earlier)} of {settings.backoff.attempts} after {earlier.status}"
            step(entry, earlier.action, node, RETRY_DUE, why)
    asked = {s.txn_id for s in plan.states if s.action == NEEDS_PERSON}
    for txn, states in plan.exhausted.items():
        if txn not in asked:
            for finding, state in states:
                step(incident(finding, txn), state.action, finding["node_id"], NEEDS_A_PERSON, state.status)
    for finding in matched:
        if finding["finding_id"] in decided:
            continue
        if finding.get("silenced"):
            entry = incident(finding, finding.get("txn_id") or "")
            entry["steps"].append(_note(SILENCED, str(finding["silenced"])))
        elif finding.get("txn_id") and finding.get("txn_id") not in incidents:
            entry = incident(finding, finding["txn_id"])
            entry["steps"].append(_note(DONE, finding.get("outcome", "")))
    for entry in incidents.values():
        if entry["new"]:  # its txn is drawn when it acts
            entry["txn_id"] = ""
    ordered = sorted(incidents.values(), key=lambda e: (e["node"], e["rule_id"], e["txn_id"]))
    # re-baselines and verifies; a cycle that drains for a fault (or holds its drains) starts no re-baseline
    blocked = "waiting: this cycle drains for a fault (the breaker's room is the fault's first)"
    if held:
        blocked = f"waiting: drains are held ({held})"
    upkeep = upkeep_preview(store, context, matched, at_ms, breaker, blocked if held or plan.drains() else "")
    return ordered + upkeep


def _note(will: str, why: str) -> dict[str, Any]:
    return {"action": "", "label": "", "will": will, "why": why}


def render_plan(entries: list[dict[str, Any]]) -> str:
    """The plan as text: one line per incident, one indented line per step."""
    if not entries:
        return "plan: nothing to do now"
    entries = terminal_safe_data(entries)  # reasons quote Slurm's, which anyone may set
    lines = [f"plan: {len(entries)} incidents (what --execute would do now)"]
    for entry in entries:
        txn = (
            "new incident" if entry["new"] else f"txn {entry['txn_id']}" if entry["txn_id"] else "no incident"
        )
        device = f", device {entry['device']}" if entry.get("device") else ""  # one rule, two GPUs
        lines.append(f"{entry['node']} {entry['rule_id']} [{entry['severity']}] {txn}{device}")
        for s in entry["steps"]:
            what = f"{s['action']}: {s['will']}" if s["action"] else s["will"]
            lines.append(f"  {what}" + (f" ({s['why']})" if s["why"] else ""))
    return "\n".join(lines)
