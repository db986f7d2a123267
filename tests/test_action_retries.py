"""Retries: a failed action of an open incident runs again after its backoff (5, 15, 45 min), every
attempt recorded in its row; past the last the incident needs a person (in the outcome line and
`stethoscope incidents`, alerted once). A drain the circuit breaker refused is retried when a slot
is free, and never beyond the breaker's limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_breaker import drain_row, resume_row
from test_execute import db, diagnose, execute_args, rules, table, worn

from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute
T0 = now_ms() - 3 * 3600_000
MINUTE = 60_000
DRAIN = "playbook:remediate/drain.yml"


def api_call(url):
    # one request an attempt (no HTTP-level retry): the attempts are the executor's
    return {
        "type": "api_call",
        "endpoint": f"{url}/v1/port/check",
        "payload": '{"n": "{{ node_id }}"}',
        "retries": 0,
    }


def cycle(tmp_path, db, rule_dir, settings, minutes, *nodes, env=None):
    at = T0 + minutes * MINUTE
    with Store(db) as store:
        for node in nodes:
            worn(store, node, at=at)
    findings, _ = diagnose(tmp_path, db, rule_dir, *settings, at=at, env=env)
    return {f["node_id"]: f for f in findings}


def row(db, action, node="node03"):
    rows = table(
        db, f"SELECT status, detail FROM DB.actions FINAL WHERE action = '{action}' AND target = '{node}'"
    )
    (status, detail) = rows[0]
    return status, json.loads(detail)


def test_a_failed_api_call_is_retried_after_its_backoff_and_stops_at_the_limit_needing_a_person(
    tmp_path, db, http_standin
):
    switch_api, hook = http_standin(fail_first=100), http_standin()
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}, api_call(switch_api.url)])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    first = cycle(tmp_path, db, rule_dir, settings, 0, "node03")["node03"]
    assert first["outcome"] == "alert ok, api_call failed" and len(switch_api.requests) == 1
    status, detail = row(db, "api_call")
    assert (status, detail["attempt"], detail["of"], detail["http_status"]) == ("failed", 1, 4, 503)
    txn = first["txn_id"]

    waiting = cycle(tmp_path, db, rule_dir, settings, 3, "node03")["node03"]  # within the first 5 min
    assert len(switch_api.requests) == 1
    assert waiting["outcome"].endswith(
        "no new action; api_call failed, retry 1 of 3 at " + detail["next_retry_at"]
    )

    attempts = {}
    for minutes in (6, 21, 66):  # 5, 15, 45 minutes after each failure
        later = cycle(tmp_path, db, rule_dir, settings, minutes, "node03")["node03"]
        attempts[minutes] = len(switch_api.requests)
    assert attempts == {6: 2, 21: 3, 66: 4}
    assert "retried api_call failed (attempt 4 of 4)" in later["outcome"]
    assert "needs a person: api_call failed 4 times (HTTP 503" in later["outcome"]
    status, detail = row(db, "api_call")
    assert (status, detail["attempt"], "next_retry_at" in detail) == ("failed", 4, False)
    assert [(h["attempt"], h["status"]) for h in detail["history"]] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]

    again = cycle(tmp_path, db, rule_dir, settings, 300, "node03")[
        "node03"
    ]  # no fifth attempt, no second alert
    assert len(switch_api.requests) == 4 and "needs a person" in again["outcome"]
    person = [r.json()["text"] for r in hook.requests if "needs a person" in r.json()["text"]]
    assert person == [f"stethoscope: incident {txn} on node03 needs a person: " + detail_reason(db)]
    listed = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "--dsn", db, "incidents"],
        capture_output=True,
        text=True,
        cwd=TOP,
    )
    assert listed.returncode == 0 and f"{txn}  node03" in listed.stdout and "needs a person" in listed.stdout


def detail_reason(db):
    (detail,) = table(db, "SELECT detail FROM DB.actions FINAL WHERE action = 'needs_person'")[0]
    return json.loads(detail)["reason"]


def test_a_retry_that_succeeds_keeps_the_failed_attempt_in_its_row(tmp_path, db, http_standin):
    switch_api = http_standin(fail_first=1)
    rule_dir = rules(tmp_path, [api_call(switch_api.url)])
    settings = execute_args(tmp_path, "stethoscope_action_backoff=2m", "stethoscope_action_retries=1")
    cycle(tmp_path, db, rule_dir, settings, 0, "node03")
    done = cycle(tmp_path, db, rule_dir, settings, 2, "node03")["node03"]
    assert "retried api_call ok (attempt 2 of 2)" in done["outcome"] and len(switch_api.requests) == 2
    status, detail = row(db, "api_call")
    assert (status, detail["attempt"], [h["status"] for h in detail["history"]]) == ("ok", 2, ["failed"])
    assert "HTTP 503" in detail["history"][0]["why"]


def test_a_refused_drain_is_retried_when_the_breaker_has_room_and_never_beyond_it(
    tmp_path, db, slurm, http_standin
):
    hook = http_standin()
    with Store(db) as store:  # node01 drained by stethoscope hours ago: the one slot of 8 nodes is taken
        drain_row(store, "node01", "ok", now_ms() - 5 * 3600_000)
    env = {**os.environ, **slurm.env}
    rule_dir = rules(tmp_path, [{"type": "playbook", "playbook": "remediate/drain.yml"}])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    first = cycle(tmp_path, db, rule_dir, settings, 0, "node02", "node03", env=env)
    assert {n: f["outcome"] for n, f in first.items()} == {
        n: f"{DRAIN} refused" for n in ("node02", "node03")
    }
    assert len(hook.requests) == 2  # each refusal alerted

    cycle(tmp_path, db, rule_dir, settings, 6, "node02", "node03", env=env)  # retried: still no room
    assert [row(db, DRAIN, n)[1]["attempt"] for n in ("node02", "node03")] == [2, 2]
    assert len(hook.requests) == 2  # a refusal again is not alerted again
    with Store(db) as store:  # verify resumed node01: one slot frees
        resume_row(store, "node01", now_ms())
    cycle(tmp_path, db, rule_dir, settings, 21, "node02", "node03", env=env)
    drained = [n for n in ("node02", "node03") if "DRAIN" in slurm.node(n)["state"]]
    assert len(drained) == 1  # the breaker lets one through, not two
    (other,) = {"node02", "node03"} - set(drained)
    assert row(db, DRAIN, other)[0] == "refused"
    status, detail = row(db, DRAIN, drained[0])
    assert (
        status == "ok"
        and detail["attempt"] == 3
        and [h["status"] for h in detail["history"]] == ["refused", "refused"]
    )

    last = cycle(tmp_path, db, rule_dir, settings, 66, "node02", "node03", env=env)
    assert "DRAIN" not in slurm.node(other)["state"] and row(db, DRAIN, other)[1]["attempt"] == 4
    assert (
        "needs a person: playbook:remediate/drain.yml refused 4 times (circuit breaker"
        in last[other]["outcome"]
    )
    assert "needs a person" not in last[drained[0]]["outcome"]
