"""serve's latest evaluation, published through its relay (serve/relay.py): `diagnose` and `summary`
run beside serve answer from it at once instead of evaluating every rule again on a machine serve keeps
busy. A command takes it only when it would evaluate what serve evaluates (the same rules, nodes,
inventory settings, model and job settings: `evaluation_key`) at "now", and only while it is fresh (no
older than two of serve's intervals and half a minute); otherwise, or with `--fresh`, it evaluates
itself. It is shown as the command's own dry run shows findings: what serve's actions did is not their
outcome (`incidents` and `actions` say that)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from stethoscope.diagnosis.findings import printable
from stethoscope.diagnosis.job_watch import JobWatch
from stethoscope.diagnosis.model_findings import ModelUse
from stethoscope.diagnosis.rules import Rule
from stethoscope.remediation.cycle import CycleResult

NAME = "evaluation"  # the relay's document name
SCHEMA = 1
KEPT = ("held", "outcome", "silenced", "unread", "nodes")  # besides the printed fields
STALE_INTERVALS, STALE_SLACK_MS = 2, 30_000


def evaluation_key(
    rules: Sequence[Rule],
    hosts: Collection[str] | None,
    settings: Mapping[str, Any],
    model: ModelUse | None,
    jobs: JobWatch | None,
    judged: Mapping[str, Any] | None = None,
) -> str:
    """What an evaluation depends on besides the data and the time, as one digest. `judged`: what an
    executor judges by that a dry run does not (stream isolation, Alertmanager's silences), where set."""
    digest = hashlib.sha256(repr(sorted(rules, key=lambda rule: rule.rule_id)).encode())
    scope = {
        "hosts": sorted(hosts) if hosts is not None else None,
        "settings": settings,
        "model": [model.meta.name, model.level] if model is not None else None,
        "jobs": repr(jobs or JobWatch()),
        "judged": dict(judged or {}),
    }
    digest.update(json.dumps(scope, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def document(result: CycleResult, key: str, interval_seconds: float) -> dict[str, Any]:
    """A cycle's result as serve publishes it (JSON)."""
    model = result.model
    return {
        "schema": SCHEMA,
        "key": key,
        "at_ms": result.at_ms,
        "interval_seconds": interval_seconds,
        "rules": result.rules,
        "findings": [printable(f, KEPT) for f in result.findings],
        "failed_rules": result.failed_rules,
        "unread_rules": result.unread_rules,
        "model": None
        if model is None
        else {"error": model.error, "ran": model.ran, "unjudged": model.unjudged},
    }


def result_of(published: Any, key: str, model: ModelUse | None, now_ms: int) -> CycleResult | None:
    """The dry-run result a command given `key` would print, from serve's published evaluation; None
    when there is none, it evaluated something else, or it is stale. `model` takes its state."""
    if not isinstance(published, dict) or published.get("schema") != SCHEMA or published.get("key") != key:
        return None
    try:
        at_ms, interval = int(published["at_ms"]), float(published["interval_seconds"])
        findings = [_as_dry_run(f) for f in published["findings"]]
        rules, failed, unread = int(published["rules"]), published["failed_rules"], published["unread_rules"]
        said = published["model"]
    except (KeyError, TypeError, ValueError):
        return None
    stale = now_ms - at_ms > STALE_INTERVALS * interval * 1000 + STALE_SLACK_MS
    if stale or (model is None) != (said is None):
        return None
    if model is not None:
        model.error, model.ran, model.unjudged = str(said["error"]), bool(said["ran"]), dict(said["unjudged"])
    return CycleResult(at_ms, findings, rules, False, model=model, failed_rules=failed, unread_rules=unread)


def _as_dry_run(finding: dict[str, Any]) -> dict[str, Any]:
    """A finding as a dry run gives it: a held or silenced one keeps why, the others no action's outcome."""
    shown = dict(finding)
    if not shown.get("held") and not shown.get("silenced"):
        shown.pop("outcome", None)
    shown.setdefault("nodes", [])
    return shown
