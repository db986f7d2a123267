"""Retries: a failed action of an open incident runs again after its backoff (5, 15, 45 min), every
attempt recorded in its row; past the last the incident needs a person (in the outcome line and
`stethoscope incidents`, alerted once). A drain the circuit breaker refused spends no attempt: it is
retried at the first cycle the breaker has room, and never beyond the breaker's limits. A drain is
retried only while a finding of its incident matches; notifications while the incident is open.
Every test takes its instants when it runs (a long suite would make an import-time one stale)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_breaker import drain_row, resume_row
from test_execute import db, diagnose, execute_args, others_report, rules, table, worn

from stethoscope.store.client import Store
from stethoscope.timeutil import iso, now_ms

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute
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


def start() -> int:
    """A test's first evaluation: 3 hours ago, so that its cycles up to 2 hours later are past."""
    return now_ms() - 3 * 3600_000


def cycle(tmp_path, db, rule_dir, settings, at, *nodes, env=None, silent=""):
    """One `diagnose --execute` at `at`: the nodes' SSDs worn then, and the other nodes reporting
    healthy; given no nodes, every node but `silent` (whose data stopped) reports healthy."""
    with Store(db) as store:
        for node in nodes:
            worn(store, node, at=at)
        if not nodes:
            others_report(store, at, besides=silent)
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
    t0 = start()
    switch_api, hook = http_standin(fail_first=100), http_standin()
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}, api_call(switch_api.url)])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node03")["node03"]
    assert first["outcome"] == "alert ok, api_call failed" and len(switch_api.requests) == 1
    status, detail = row(db, "api_call")
    assert (status, detail["attempt"], detail["of"], detail["http_status"]) == ("failed", 1, 4, 503)
    txn = first["txn_id"]

    waiting = cycle(tmp_path, db, rule_dir, settings, t0 + 3 * MINUTE, "node03")["node03"]  # within 5 min
    assert len(switch_api.requests) == 1
    assert waiting["outcome"].endswith(
        "no new action; api_call failed, retry 1 of 3 at " + detail["next_retry_at"]
    )

    attempts = {}
    for minutes in (6, 21, 66):  # 5, 15, 45 minutes after each failure
        later = cycle(tmp_path, db, rule_dir, settings, t0 + minutes * MINUTE, "node03")["node03"]
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

    # no fifth attempt, no second alert
    again = cycle(tmp_path, db, rule_dir, settings, t0 + 300 * MINUTE, "node03")["node03"]
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
    t0 = start()
    switch_api = http_standin(fail_first=1)
    rule_dir = rules(tmp_path, [api_call(switch_api.url)])
    settings = execute_args(tmp_path, "stethoscope_action_backoff=2m", "stethoscope_action_retries=1")
    cycle(tmp_path, db, rule_dir, settings, t0, "node03")
    done = cycle(tmp_path, db, rule_dir, settings, t0 + 2 * MINUTE, "node03")["node03"]
    assert "retried api_call ok (attempt 2 of 2)" in done["outcome"] and len(switch_api.requests) == 2
    status, detail = row(db, "api_call")
    assert (status, detail["attempt"], [h["status"] for h in detail["history"]]) == ("ok", 2, ["failed"])
    assert "HTTP 503" in detail["history"][0]["why"]


def test_a_drain_refused_for_over_an_hour_spends_no_attempt_and_drains_when_the_breaker_has_room(
    tmp_path, db, slurm, http_standin
):
    """Regression: a refusal counted as an attempt and waited 5, 15, 45 min like a failure;
    with the breaker full for an hour the incident ended as "needs a person" (refused 4 times)
    without a drain ever tried while there was room."""
    t0 = start()
    hook = http_standin()
    with Store(db) as store:  # node01 drained by stethoscope hours ago: the one slot of 8 nodes is taken
        drain_row(store, "node01", "ok", now_ms() - 5 * 3600_000)
    env = {**os.environ, **slurm.env}
    rule_dir = rules(tmp_path, [{"type": "playbook", "playbook": "remediate/drain.yml"}])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node02", "node03", env=env)
    assert {n: f["outcome"] for n, f in first.items()} == {
        n: f"{DRAIN} refused" for n in ("node02", "node03")
    }
    assert len(hook.requests) == 2  # each refusal alerted
    assert [row(db, DRAIN, n)[1]["attempt"] for n in ("node02", "node03")] == [1, 1]

    for minutes in (6, 21, 66, 75):  # the breaker stays full for more than an hour
        waiting = cycle(tmp_path, db, rule_dir, settings, t0 + minutes * MINUTE, "node02", "node03", env=env)
    assert {n: f["outcome"] for n, f in waiting.items()} == {
        n: f"open since {iso(t0)} under txn {first[n]['txn_id']}: no new action; "
        f"{DRAIN} refused, attempt 1 of 4 runs when the circuit breaker has room while a finding of "
        "the incident matches"
        for n in ("node02", "node03")
    }
    assert [row(db, DRAIN, n)[1]["attempt"] for n in ("node02", "node03")] == [1, 1]  # nothing tried
    assert table(db, "SELECT count() FROM DB.actions WHERE action = 'needs_person'") == [(0,)]
    assert len(hook.requests) == 2  # a refusal again is not alerted again
    assert "next_retry_at" not in row(db, DRAIN, "node02")[1]  # no backoff: due whenever there is room

    with Store(db) as store:  # verify resumed node01: one slot frees
        resume_row(store, "node01", now_ms())
    cycle(tmp_path, db, rule_dir, settings, t0 + 76 * MINUTE, "node02", "node03", env=env)
    drained = [n for n in ("node02", "node03") if "DRAIN" in slurm.node(n)["state"]]
    assert len(drained) == 1  # the breaker lets one through, not two
    (other,) = {"node02", "node03"} - set(drained)
    status, detail = row(db, DRAIN, drained[0])
    assert (status, detail["attempt"], [h["status"] for h in detail["history"]]) == ("ok", 1, ["refused"])

    last = cycle(tmp_path, db, rule_dir, settings, t0 + 140 * MINUTE, "node02", "node03", env=env)
    assert "DRAIN" not in slurm.node(other)["state"]  # never beyond the breaker
    assert row(db, DRAIN, other)[0] == "refused" and row(db, DRAIN, other)[1]["attempt"] == 1
    assert "needs a person" not in last[other]["outcome"] + last[drained[0]]["outcome"]


def test_a_drain_is_retried_only_while_its_incident_matches_and_a_notification_while_it_is_open(
    tmp_path, db, slurm, http_standin
):
    """Regression: the retries took every open incident's actions, a finding held open or stale
    included: a refused drain was retried (and the node drained) after the node's data had stopped."""
    t0 = start()
    switch_api = http_standin(fail_first=100)
    with Store(db) as store:  # the one slot of 8 nodes is taken
        drain_row(store, "node01", "ok", now_ms() - 5 * 3600_000)
    env = {**os.environ, **slurm.env}
    rule_dir = rules(
        tmp_path, [api_call(switch_api.url), {"type": "playbook", "playbook": "remediate/drain.yml"}]
    )
    settings = execute_args(tmp_path)
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node03", env=env)["node03"]
    assert first["outcome"] == f"api_call failed, {DRAIN} refused"
    with Store(db) as store:  # room now
        resume_row(store, "node01", now_ms())

    stale = cycle(tmp_path, db, rule_dir, settings, t0 + 6 * MINUTE, env=env, silent="node03")
    assert "node03" not in stale  # node03 said nothing in the rule's window: its finding did not match
    (status,) = table(
        db, f"SELECT argMax(status, version) FROM DB.findings WHERE txn_id = '{first['txn_id']}'"
    )[0]
    assert status == "stale"  # open, not resolved: its incident is open
    assert len(switch_api.requests) == 2  # the notification retried while the incident is open
    assert "DRAIN" not in slurm.node("node03")["state"]  # no drain for a finding that does not match
    assert row(db, DRAIN)[0] == "refused"

    again = cycle(tmp_path, db, rule_dir, settings, t0 + 8 * MINUTE, "node03", env=env)["node03"]
    assert "DRAIN" in slurm.node("node03")["state"], again["outcome"]  # it matches again: drained
    status, detail = row(db, DRAIN)
    assert (status, detail["attempt"]) == ("ok", 1)


def test_a_failed_row_recorded_before_retries_waits_its_first_backoff(tmp_path, db, http_standin):
    """Regression: a row from before `next_retry_at` was recorded (an upgrade) was due at once, old
    failed drains included; it is due its first backoff (5 min) after it started."""
    t0 = start()
    switch_api = http_standin(fail_first=100)
    rule_dir = rules(tmp_path, [api_call(switch_api.url)])
    settings = execute_args(tmp_path)
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node03")["node03"]
    assert len(switch_api.requests) == 1
    (finding_id,) = table(db, "SELECT DISTINCT finding_id FROM DB.actions WHERE action = 'api_call'")[0]
    with Store(db) as store:  # the row as the executor wrote it before retries: no attempt, no next time
        old = {
            "txn_id": first["txn_id"],
            "finding_id": finding_id,
            "action": "api_call",
            "target": "node03",
            "status": "failed",
            "detail": json.dumps({"http_status": 503, "attempts": 1}),
            "started_at": t0,
            "finished_at": t0 + 1_000,
            "version": now_ms() + 60_000,
        }
        store.insert_rows("actions", [old])

    waiting = cycle(tmp_path, db, rule_dir, settings, t0 + 2 * MINUTE, "node03")["node03"]
    assert len(switch_api.requests) == 1, waiting["outcome"]  # not at once
    assert waiting["outcome"].endswith(f"api_call failed, retry 1 of 3 at {iso(t0 + 5 * MINUTE)}")
    cycle(tmp_path, db, rule_dir, settings, t0 + 6 * MINUTE, "node03")
    assert len(switch_api.requests) == 2
