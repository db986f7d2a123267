"""The actions that tell: `log` (a line in the findings log, the operator's own file), `alert` (a
webhook, or said as skipped when none is configured) and `api_call` (a rule's HTTP endpoint). Each
call carries the incident's transaction id as its idempotency key: a retry after a crash is safe."""

from __future__ import annotations

import json
import os
from typing import Any

from stethoscope.diagnosis.findings import printable
from stethoscope.private_files import private_dir
from stethoscope.remediation import alertmanager
from stethoscope.remediation.actions.http import send
from stethoscope.remediation.actions.means import Act, Means, Result
from stethoscope.store.dsn import redact
from stethoscope.templating import Undefined, render
from stethoscope.timeutil import iso, now_ms


def message_of(act: Act) -> str:
    """The action's message template, else the rule's, rendered; without either, the finding's
    message as it is (it quotes stored data, which is never a template)."""
    template = act.params.get("message") or act.finding.get("rule_message")
    return render(template, act.context) if template else act.finding["message"]


def log(means: Means, act: Act) -> Result:
    finding = act.finding
    message = message_of(act)
    entry = {"at": iso(now_ms()), "txn_id": finding["txn_id"], **printable(finding), "message": message}
    private_dir(means.log_path.parent)
    # findings name nodes and their faults: the log is its owner's alone, wherever it is set
    # (one an older version left readable becomes private too)
    descriptor = os.open(means.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry, sort_keys=True) + "\n")
    return "ok", str(means.log_path), {"message": message}


def alert(means: Means, act: Act) -> Result:
    return send_alert(means, act, message_of(act))


def send_alert(means: Means, act: Act, message: str) -> Result:
    """`message` to the action's endpoint, else to Alertmanager (`stethoscope_alertmanager_url`), else
    `stethoscope_alert_webhook`; skipped without one."""
    finding = act.finding
    alertmanager_url = means.ctx.setting(alertmanager.SETTING)
    if alertmanager_url and not act.params.get("endpoint"):
        return _to_alertmanager(means, act, message, render(str(alertmanager_url), act.context))
    endpoint_template = act.params.get("endpoint") or means.ctx.setting("stethoscope_alert_webhook")
    if not endpoint_template:
        return (
            "skipped",
            "",
            {"message": message, "reason": "no webhook configured (stethoscope_alert_webhook)"},
        )
    endpoint = render(str(endpoint_template), act.context)
    body = {"text": message, "txn_id": finding["txn_id"], "finding": printable(finding)}
    result = send(
        endpoint,
        json.dumps(body, sort_keys=True).encode(),
        idempotency_key=finding["txn_id"],
        timeout=means.http_timeout,
        retries=means.http_retries,
    )
    detail: dict[str, Any] = {"message": message, "http_status": result.status, "attempts": result.attempts}
    if not result.ok:
        detail["response"] = result.detail
    return ("ok" if result.ok else "failed"), endpoint, detail


def _to_alertmanager(means: Means, act: Act, message: str, url: str) -> Result:
    """The finding as one alert to Alertmanager's v2 API (remediation.alertmanager)."""
    alert = alertmanager.alert_of(act.finding, message)
    endpoint, result = alertmanager.post_alerts(
        url, [alert], key=act.finding["txn_id"], timeout=means.http_timeout, retries=means.http_retries
    )
    detail: dict[str, Any] = {"message": message, "http_status": result.status, "attempts": result.attempts}
    if not result.ok:
        detail["response"] = result.detail
    return ("ok" if result.ok else "failed"), redact(endpoint), detail


def api_call(means: Means, act: Act) -> Result:
    params, context = act.params, act.context
    try:
        endpoint = render(params["endpoint"], context)
    except Undefined as exc:  # its endpoint names a setting not configured: nothing to call
        return "skipped", "", {"reason": f"endpoint not configured: {exc}"}
    payload = render(params["payload"], context) if "payload" in params else None
    headers = {k: render(str(v), context) for k, v in (params.get("headers") or {}).items()}
    result = send(
        endpoint,
        payload.encode() if payload is not None else None,
        method=str(params.get("method", "POST")).upper(),
        idempotency_key=act.finding["txn_id"],
        headers=headers,
        timeout=float(params.get("timeout", 10)),
        retries=int(params.get("retries", 3)),
    )
    detail = {"http_status": result.status, "attempts": result.attempts, "response": result.detail}
    return ("ok" if result.ok else "failed"), endpoint, detail
