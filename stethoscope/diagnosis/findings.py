"""Findings from rule matches and from metrics that stopped arriving (what `stethoscope diagnose`
prints), each with the actions it would take: the rule's own, or its level's defaults. A rule whose
evaluation failed is a `rule_failed` finding on the controller (device: the rule), beside the other
rules' findings: one rule, or one node's data, never costs the cycle."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from stethoscope import templating
from stethoscope.catalog import Catalog
from stethoscope.diagnosis.cadence import Cadence, window_of
from stethoscope.diagnosis.engine import MATCHES, MESSAGE, QUERY, SAMPLES, Match, RuleFailure, evaluate_all
from stethoscope.diagnosis.hysteresis import Held
from stethoscope.diagnosis.job_watch import JobWatch, held_off, hung_finding, hung_jobs
from stethoscope.diagnosis.levels import (
    DEFAULT_LEVEL,
    LEVEL_ACTIONS,
    SEVERITY_ORDER,
    action_label,
    finding_id,
)
from stethoscope.diagnosis.model_findings import ModelUse, agrees, finding_dicts, pair
from stethoscope.diagnosis.rules import Action, Group, Rule
from stethoscope.diagnosis.unknown import (
    FLEET_RULE,
    UNREACHABLE_RULE,
    Fleet,
    Silence,
    survey,
)
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.timeutil import iso

log = logging.getLogger(__name__)
MESSAGE_CAP = 300  # characters of an UNKNOWN finding's message: one line, whatever fell silent
RULE_FAILED = "rule_failed"  # the finding of a rule whose evaluation failed
CONTROLLER = "controller"  # its node: where the rule ran, not where the data came from
ERROR_CAP = 2000  # characters of the failure's error kept in the finding's evidence


def template_context(
    finding: dict[str, Any], txn_id: str = "", variables: dict[str, Any] | None = None
) -> dict:
    return {
        "node_id": finding["node_id"],
        "device": finding["device"],
        "value": finding["value"],
        "values": finding["values"],
        "timestamp": finding["first_seen"],
        "rule_id": finding["rule_id"],
        "txn_id": txn_id,
        "nodes": finding.get("nodes", []),
        "vars": variables or {},
        **window_counts(finding["values"]),
    }


def window_counts(values: dict[str, float]) -> dict[str, int]:
    """`matches` and `samples` of an `aggregate: any` condition (of several, the first by metric name):
    how many of the window's samples passed, of how many; nothing for a rule without one."""
    counted = sorted(key for key in values if key.endswith(MATCHES))
    if not counted:
        return {}
    metric = counted[0].removesuffix(MATCHES)
    return {"matches": int(values[counted[0]]), "samples": int(values.get(metric + SAMPLES, 0))}


def _message(rule: Rule, finding: dict[str, Any]) -> tuple[str, str | None]:
    """The finding's message, and the error of a template that failed for another reason than a
    name only an execution defines (a division by a zero value, a loop past the time bound): that
    costs the rule a `rule_failed` finding, never the cycle, and the finding keeps a plain message."""
    templates = [rule.message] if rule.message else []
    templates += [dict(a.params)["message"] for a in rule.actions if a.type in ("log", "alert")]
    context = template_context(finding)
    error = None
    for template in templates:
        try:
            return templating.render(template, context), error
        except templating.Undefined:
            continue  # a message naming configured variables renders only when executed
        except templating.TemplateFailure as exc:
            error = error or str(exc)
    plain = f"{finding['node_id']} {finding['device']}: {rule.description}".replace("  ", " ")
    return plain, error


def _finding(
    rule: Rule,
    match: Match,
    at_ms: int,
    evidence: dict[str, Any] | None = None,
    literal: str | None = None,
    failed: list[RuleFailure] | None = None,
) -> dict[str, Any]:
    """`literal`: the message as it is (text built from stored data, which is never a template);
    `failed`: where a message template's failure is told."""
    level = rule.level or DEFAULT_LEVEL[rule.severity]
    if evidence is None:
        evidence = dict(match.values)
        if match.nodes:
            evidence["nodes"] = match.nodes
    finding = {
        "finding_id": finding_id(rule.rule_id, match.node_id, match.device),
        "rule_id": rule.rule_id,
        "node_id": match.node_id,
        "device": match.device,
        "severity": rule.severity,
        "confidence": rule.confidence,
        "level": level,
        "first_seen": iso(at_ms),
        "message": "",
        "evidence": json.dumps(evidence, sort_keys=True),
        "actions": [action_label(a) for a in rule.actions or LEVEL_ACTIONS[level]],
        # kept for execution, dropped from the printed finding
        "value": match.value,
        "values": match.values,
        "nodes": match.nodes,
        "plan": rule.actions or LEVEL_ACTIONS[level],
        "cooldown_seconds": rule.cooldown_seconds,
        "rule_message": rule.message,
        "window_seconds": window_of(rule),  # as fitted to the cadence: how long it must stay clear
    }
    if literal is not None:
        finding["message"] = literal
        return finding
    finding["message"], error = _message(rule, finding)
    if error is not None and failed is not None:
        failed.append(RuleFailure(rule.rule_id, f"{rule.file}:{rule.line}", f"message: {error}", MESSAGE))
    return finding


def held_finding(held: Held, rules: Sequence[Rule]) -> dict[str, Any]:
    """A finding that did not match this evaluation and stays open (diagnosis.hysteresis), shaped as
    `diagnose` gives findings, from what the findings table (or the last cycle) holds of it."""
    p = held.previous
    rule = next((r for r in rules if r.rule_id == p.rule_id), None)
    level = p.level or (rule.level if rule and rule.level else DEFAULT_LEVEL.get(p.severity, "L2"))
    plan = (rule.actions if rule else ()) or LEVEL_ACTIONS[level]
    return {
        "finding_id": p.finding_id,
        "rule_id": p.rule_id,
        "node_id": p.node_id,
        "device": p.device,
        "severity": p.severity,
        "confidence": p.confidence,
        "level": level,
        "first_seen": iso(p.first_seen_ms),
        "message": p.message,
        "evidence": p.evidence,
        "actions": [action_label(a) for a in plan],
        "value": 0.0,
        "values": {},
        "nodes": [],
        "plan": plan,
        "cooldown_seconds": rule.cooldown_seconds if rule else 3600,
        "rule_message": rule.message if rule else None,
        "window_seconds": window_of(rule) if rule else 0,
        "txn_id": p.txn_id,
        "first_seen_ms": p.first_seen_ms,
        "last_seen_ms": p.last_seen_ms,
        "held": True,
        "outcome": held.why,
    }


def _unknown_message(silence: Silence, where: str) -> str:
    """One line, at most MESSAGE_CAP characters, however many nodes or devices fell silent."""
    return _capped(_unknown_text(silence, where))


def _capped(text: str, cap: int = 0) -> str:
    cap = cap or MESSAGE_CAP
    return text if len(text) <= cap else text[: cap - 1].rstrip(" ,;") + "…"


def _unknown_text(silence: Silence, where: str) -> str:
    since = iso(silence.last_seen_ms) if silence.last_seen_ms else ""
    if silence.rule_id == FLEET_RULE and silence.empty:
        whose = f"any of the {len(silence.nodes)} nodes of the inventory" if silence.nodes else "any node"
        return (
            f"UNKNOWN fleet: no data from {whose} in {where}: the store is empty or points elsewhere, "
            "or nothing was collected yet (playbooks/collect.yml, the push agents)"
        )
    if silence.rule_id == FLEET_RULE:
        named = ", ".join(silence.nodes[:10]) + (", ..." if len(silence.nodes) > 10 else "")
        return (
            f"UNKNOWN fleet: {len(silence.nodes)} nodes silent at once ({named}): "
            "the collector, the network or the store is down rather than the nodes"
        )
    if silence.rule_id == UNREACHABLE_RULE:
        return f"{silence.node_id}: UNKNOWN, unreachable by the sweep since {since}"
    if silence.devices:
        series = sum(len(names) for names in silence.devices.values())
        listed = "; ".join(f"{device} ({', '.join(names)})" for device, names in silence.devices.items())
        return (
            f"{silence.node_id}: UNKNOWN, {series} series on {len(silence.devices)} devices not reported "
            f"since {since}: {listed}"
        )
    return f"{silence.node_id}: UNKNOWN, nothing reported " + (f"since {since}" if since else "ever")


def _unknown_findings(
    store: Store, catalog: Catalog, at_ms: int, fleet: Fleet | None, nodes: Sequence[str] | None
) -> list[dict[str, Any]]:
    findings = []
    wanted = None if nodes is None else set(nodes)
    where = f"database {store.database} of {redact(store.dsn)}"
    for silence in survey(store, catalog, at_ms, fleet).silences:
        if wanted is not None and silence.rule_id != FLEET_RULE and silence.node_id not in wanted:
            continue
        message = _unknown_message(silence, where)
        # a fleet finding names no host: log and alert (its message as it is), no playbook
        actions = (Action("log", ()), Action("alert", ())) if silence.rule_id == FLEET_RULE else ()
        rule = Rule(silence.rule_id, "stopped reporting", silence.severity, Group("all", ()), actions, "L2")
        match = Match(silence.node_id, silence.device, 0.0, nodes=silence.nodes)
        evidence: dict[str, Any] = {"metrics": silence.metrics}
        evidence["last_seen"] = iso(silence.last_seen_ms) if silence.last_seen_ms else None
        if silence.nodes:
            evidence["nodes"] = silence.nodes
        if silence.devices:
            evidence["devices"] = silence.devices
        findings.append(_finding(rule, match, at_ms, evidence, literal=message))
    return findings


def failure_finding(failure: RuleFailure, at_ms: int) -> dict[str, Any]:
    """A rule that failed, as a warning on the controller: log and alert, no playbook."""
    error = " ".join(failure.error.split())
    said = _capped(f"rule {failure.rule_id} ({failure.where}) failed: {error}")
    actions = (Action("log", ()), Action("alert", ()))  # the message as it is: an error may quote SQL
    rule = Rule(RULE_FAILED, "a rule's evaluation failed", "warning", Group("all", ()), actions, "L2")
    evidence = {
        "rule_id": failure.rule_id,
        "where": failure.where,
        "stage": failure.stage,
        "error": _capped(error, ERROR_CAP),
    }
    finding = _finding(rule, Match(CONTROLLER, failure.rule_id, 0.0), at_ms, evidence, literal=said)
    finding["unread"] = failure.stage == QUERY  # nothing of the rule was read (not printed)
    return finding


def _one_per_rule(failures: list[RuleFailure]) -> list[RuleFailure]:
    """A rule's failures as one (its findings share one id): the first error, and how many more."""
    by_rule: dict[str, list[RuleFailure]] = {}
    for failure in failures:
        by_rule.setdefault(failure.rule_id, []).append(failure)
    joined = []
    for first, *more in by_rule.values():
        extra = f" (and {len(more)} more: {more[0].error})" if more else ""
        joined.append(replace(first, error=first.error + extra))
    return joined


def diagnose(
    store: Store,
    rules: list[Rule],
    at_ms: int,
    catalog: Catalog | None = None,
    nodes: Sequence[str] | None = None,
    fleet: Fleet | None = None,
    model: ModelUse | None = None,
    cadence: Cadence | None = None,
    jobs: JobWatch | None = None,
) -> list[dict[str, Any]]:
    """Every finding at `at_ms`, most severe first; deterministic for the same data and rules, which
    are read by a few connections at once (engine.evaluate_all), each fitted to the cadence its
    series report at (`cadence`, else learned from the store now). With
    `nodes` (an inventory's hosts), only those nodes' data is read; with a fleet (the inventory given),
    UNKNOWN also answers for its nodes that say nothing; with a model, its findings too, each beside
    the rule finding of its layer on its node where there is one (diagnosis.model_findings). The
    job-level rules hold off through a job's warm-up, and a job that hangs is a finding of its own
    (diagnosis.job_watch, `jobs`: its settings, default JobWatch()). It writes nothing: a host the
    store never saw is new (within its grace) until a recording cycle (serve, watch, --execute) says
    when it first was (unknown.record_new_hosts)."""
    cadence = cadence if cadence is not None else Cadence.learn(store, at_ms, nodes)
    jobs = jobs if jobs is not None else JobWatch()
    ordered = sorted(cadence.fit_all(rules), key=lambda r: r.rule_id)
    evaluation = evaluate_all(store, ordered, at_ms, nodes=nodes)
    failures = list(evaluation.failures)
    matched = [(rule, m) for rule, matches in zip(ordered, evaluation.matches, strict=True) for m in matches]
    warming = held_off(store, ordered, matched, at_ms, nodes, jobs)
    findings = [
        _finding(rule, m, at_ms, failed=failures)
        for rule, m in matched
        if (rule.rule_id, m.node_id) not in warming
    ]
    findings += [hung_finding(h, at_ms) for h in hung_jobs(store, at_ms, nodes, findings, ordered)]
    for failure in _one_per_rule(failures):
        log.warning("rule %s (%s) failed; the other rules' findings stand", failure.rule_id, failure.where)
        findings.append(failure_finding(failure, at_ms))
    if catalog is not None:
        findings += _unknown_findings(store, catalog, at_ms, fleet, nodes)
    if model is not None:
        try:
            findings += finding_dicts(store, at_ms, nodes, model)
        except Exception as exc:  # a model that breaks under a running watch or serve costs its part only
            model.ran, model.error = False, f"{type(exc).__name__}: {exc}"
            log.warning("model %s: %s; the rules' findings stand", model.meta.name, model.error)
    findings.sort(key=lambda f: (-SEVERITY_ORDER[f["severity"]], f["node_id"], f["rule_id"], f["device"]))
    if model is not None:
        pair(findings, rules, catalog)
    return findings


PRINTED = (
    "finding_id",
    "rule_id",
    "node_id",
    "device",
    "severity",
    "confidence",
    "level",
    "first_seen",
    "message",
    "evidence",
    "actions",
    "explanation",  # model findings
    "path",
    "supports",
    "model",  # a rule finding the model agrees with
)


def printable(finding: dict[str, Any], extra: tuple[str, ...] = ()) -> dict[str, Any]:
    return {key: finding[key] for key in (*PRINTED, *extra) if key in finding}


def render(findings: list[dict[str, Any]], rule_count: int, executed: bool = False, model: str = "") -> str:
    """One line per alarm; a model finding that supports a rule finding is a "model agrees" line
    under it, not an alarm of its own. `model`: the model's name when it ran."""
    mode = "executed" if executed else "dry-run: no action taken"
    also = f", and the model {model}" if model else ""
    alarms = [f for f in findings if not f.get("supports")]
    if not alarms:
        return f"healthy: {rule_count} rules, no finding ({'executed' if executed else 'dry-run'}){also}"
    lines = [f"{len(alarms)} findings from {rule_count} rules ({mode}){also}"]
    for f in alarms:
        outcome = f"  {f['outcome']}" if f.get("outcome") else ""
        evidence = "" if f["rule_id"].startswith("model.") else f"  evidence {f['evidence']}"
        lines.append(
            f"{f['severity'].upper():<9}{f['node_id']:<14}{f['device'] or '-':<16}{f['rule_id']:<36}"
            f"{f['level']} {f['confidence']:.2f}  {f['message']}{evidence}  "
            f"actions {','.join(f['actions'])}{outcome}"
        )
        lines += [f"{'':<9}{'':<14}{'':<16}  {agrees(support)}" for support in f.get("model", [])]
    return "\n".join(lines)
