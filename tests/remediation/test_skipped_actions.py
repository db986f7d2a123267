"""An action with nothing configured to act with is `skipped` with the reason, never `failed`, whatever
its kind: an alert without a webhook, an api_call whose endpoint names a setting nobody set, the
ticket playbook without a ticket backend; and a skipped action is not retried."""

from __future__ import annotations

import json

from test_execute import db, diagnose, execute_args, rules, table, worn
from test_incidents import modules_in_this_python

from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

__all__ = ["db"]  # the fixture, shared with test_execute
T0 = now_ms() - 3 * 3600_000
MINUTE = 60_000
TICKET = "playbook:remediate/ticket.yml"


def test_an_unconfigured_backend_is_skipped_with_its_reason_for_every_action_kind(tmp_path, db):
    actions = [
        {"type": "alert", "message": "worn"},
        {"type": "api_call", "endpoint": "{{ vars.switch_api }}/v1/port/check"},
        {"type": "playbook", "playbook": "remediate/ticket.yml"},
    ]
    rule_dir = rules(tmp_path, actions)
    settings = execute_args(tmp_path)  # no webhook, no switch_api, no ticket URL
    modules_in_this_python(tmp_path)
    for minutes in (0, 10):  # past the first retry's backoff: nothing is tried again
        with Store(db) as store:
            worn(store, "node03", at=T0 + minutes * MINUTE)
        (finding,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0 + minutes * MINUTE)
        if minutes == 0:
            assert finding["outcome"] == f"alert skipped, api_call skipped, {TICKET} skipped"
    assert finding["outcome"].endswith("no new action")
    rows = table(db, "SELECT action, status, detail FROM DB.actions FINAL ORDER BY action")
    reasons = {action: (status, json.loads(detail)) for action, status, detail in rows}
    assert {action: status for action, (status, _) in reasons.items()} == {
        "alert": "skipped",
        "api_call": "skipped",
        TICKET: "skipped",
    }
    assert reasons["alert"][1]["reason"] == "no webhook configured (stethoscope_alert_webhook)"
    assert reasons["api_call"][1]["reason"].startswith("endpoint not configured: template")
    assert "switch_api" in reasons["api_call"][1]["reason"]
    assert reasons[TICKET][1]["reason"] == (
        "no ticket backend configured: stethoscope_ticket_url is empty (the jira backend needs its URL)"
    )
    assert all(d["attempt"] == 1 and "next_retry_at" not in d for _, d in reasons.values())
