"""Findings from rule matches (dry-run): what `stethoscope diagnose` prints. Executing the actions,
storing findings and actions, cooldowns and UNKNOWN come with the rest of issue 4."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from jinja2.sandbox import SandboxedEnvironment

from stethoscope.engine import Match, evaluate
from stethoscope.rules import Rule
from stethoscope.store import Store
from stethoscope.timeutil import iso

SEVERITY_ORDER = {"info": 0, "warning": 1, "unknown": 1, "critical": 2}
DEFAULT_LEVEL = {"info": "L1", "warning": "L2", "unknown": "L2", "critical": "L3"}
LEVEL_ACTIONS = {
    "L1": ["log"],
    "L2": ["log", "alert"],
    "L3": ["log", "alert", "evidence", "ticket"],
    "L4": ["log", "alert", "evidence", "ticket", "drain"],
}
_SANDBOX = SandboxedEnvironment()


def finding_id(rule_id: str, node_id: str, device: str) -> str:
    return hashlib.sha256(f"{rule_id}|{node_id}|{device}".encode()).hexdigest()[:16]


def _message(rule: Rule, match: Match, at_ms: int) -> str:
    context: dict[str, Any] = {
        "node_id": match.node_id,
        "device": match.device,
        "value": match.value,
        "values": match.values,
        "timestamp": iso(at_ms),
        "rule_id": rule.rule_id,
        "txn_id": "",
    }
    for action in rule.actions:
        params = dict(action.params)
        if action.type in ("log", "alert") and isinstance(params.get("message"), str):
            return _SANDBOX.from_string(params["message"]).render(**context)
    return f"{match.node_id} {match.device}: {rule.description}"


def diagnose(store: Store, rules: list[Rule], at_ms: int) -> list[dict[str, Any]]:
    findings = []
    for rule in sorted(rules, key=lambda r: r.rule_id):
        level = rule.level or DEFAULT_LEVEL[rule.severity]
        for match in evaluate(store, rule, at_ms):
            findings.append(
                {
                    "finding_id": finding_id(rule.rule_id, match.node_id, match.device),
                    "rule_id": rule.rule_id,
                    "node_id": match.node_id,
                    "device": match.device,
                    "severity": rule.severity,
                    "confidence": rule.confidence,
                    "level": level,
                    "first_seen": iso(at_ms),
                    "message": _message(rule, match, at_ms),
                    "evidence": json.dumps(match.values, sort_keys=True),
                    "actions": [a.type for a in rule.actions] or LEVEL_ACTIONS[level],
                }
            )
    return sorted(
        findings, key=lambda f: (-SEVERITY_ORDER[f["severity"]], f["node_id"], f["rule_id"], f["device"])
    )


def render(findings: list[dict[str, Any]], rule_count: int) -> str:
    if not findings:
        return f"healthy: {rule_count} rules, no finding (dry-run)"
    lines = [f"{len(findings)} findings from {rule_count} rules (dry-run: no action taken)"]
    for f in findings:
        lines.append(
            f"{f['severity'].upper():<9}{f['node_id']:<10}{f['device']:<16}{f['rule_id']:<28}"
            f"{f['level']}  {f['message']}  evidence {f['evidence']}  actions {','.join(f['actions'])}"
        )
    return "\n".join(lines)
