"""The life of a finding under `diagnose --execute`: one transaction, one ticket and one drain however
long it stays open; stale (not resolved) when its data stops; resolved by fresh healthy data, or for a
drained node only by verify's resume; a family's more severe member escalates the one transaction;
the cooldown holds only a re-open after a resolve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from test_execute import db, diagnose, execute_args, others_report, table, worn

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import LAB_INVENTORY, TOP

__all__ = ["db"]  # the fixture, shared with test_execute

T0 = now_ms() - 3 * 3600_000
MINUTE = 60_000
ACTIONS = {"alert": {"type": "alert", "message": "worn"}}


def healthy(store, node, at):  # the SSD replaced: no reallocated sector, full life
    batch = MetricColumns()
    batch.append(node, "smart_reallocated_sector_ct", "sda", {}, 0.0, at)
    batch.append(node, "smart_media_wearout_indicator_normalized", "sda", {}, 97.0, at)
    store.insert_metrics(batch)
    others_report(store, at, besides=node)


def sectors(store, node, value, at):
    batch = MetricColumns()
    batch.append(node, "smart_reallocated_sector_ct", "sda", {}, value, at)
    store.insert_metrics(batch)
    others_report(store, at, besides=node)


def rule_file(tmp_path, *rules):
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "rules.yml").write_text(textwrap.dedent("".join(rules)))
    return folder


def worn_rule(actions, cooldown="1h"):
    return f"""
    - rule_id: worn_ssd
      description: worn SSD (test)
      severity: critical
      cooldown: {cooldown}
      trigger:
        - {{metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 5m, aggregate: last}}
        - {{metric: smart_media_wearout_indicator_normalized, operator: "<", threshold: 10, window: 5m,
           aggregate: last}}
      action: {json.dumps(actions)}
    """


def status(db, rule_id="worn_ssd"):
    rows = table(db, f"SELECT status, txn_id FROM DB.findings FINAL WHERE rule_id = '{rule_id}'")
    return rows[0] if rows else None


def verify(db, *extra, env=None):
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", db, "verify", *extra]
    command += ["--inventory", str(LAB_INVENTORY)]
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, env=env, check=False)


def test_an_open_finding_past_its_cooldown_gets_no_new_txn_ticket_or_drain(tmp_path, db, http_standin, slurm):
    jira = http_standin()
    actions = [
        {"type": "playbook", "playbook": "remediate/drain.yml"},
        {"type": "api_call", "endpoint": "{{ vars.jira }}/ticket", "payload": '{"n": "{{ node_id }}"}'},
    ]
    rule_dir = rule_file(tmp_path, worn_rule(actions, cooldown="30m"))
    env = {**os.environ, **slurm.env}
    settings = execute_args(tmp_path, f"jira={jira.url}")
    txns = []
    for at in (T0, T0 + 40 * MINUTE, T0 + 100 * MINUTE):  # each past the cooldown of the one before
        with Store(db) as store:
            worn(store, "node03", at=at)
        (finding,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=at, env=env)
        txns.append(finding["txn_id"])
    assert txns == [txns[0]] * 3 and "no new action" in finding["outcome"]
    assert len(jira.requests) == 1 and jira.requests[0].headers["Idempotency-Key"] == txns[0]
    assert slurm.node("node03")["reason"].startswith(f"stethoscope: worn_ssd {txns[0]}")
    drains = table(db, "SELECT count() FROM DB.actions FINAL WHERE action = 'playbook:remediate/drain.yml'")
    assert drains == [(1,)]
    verdict = verify(db, "--node", "node03", "--txn", txns[0], env=env)
    assert json.loads(verdict.stdout)["drain_recorded"] is True


def test_data_that_stops_leaves_the_finding_stale_and_fresh_healthy_data_resolves_it(
    tmp_path, db, http_standin
):
    hook = http_standin()
    rule_dir = rule_file(tmp_path, worn_rule([ACTIONS["alert"]]))
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    with Store(db) as store:
        for at in (T0 - 2 * MINUTE, T0 - MINUTE, T0):  # swept every minute: the cadence UNKNOWN learns
            worn(store, "node03", at=at)
        for at in (T0 - 2 * MINUTE, T0 - MINUTE, T0, T0 + 10 * MINUTE):  # the rest goes on reporting
            others_report(store, at)
    diagnose(tmp_path, db, rule_dir, *settings, at=T0)
    diagnose(tmp_path, db, rule_dir, *settings, at=T0 + 10 * MINUTE)  # nothing came in since
    assert status(db)[0] == "stale" and status(db, "unknown.node")[0] == "open"  # UNKNOWN speaks for it
    with Store(db) as store:  # a whole window (5m) of fresh healthy sweeps: one sample is not enough
        healthy(store, "node03", T0 + 20 * MINUTE)
        others_report(store, T0 + 20 * MINUTE)
    diagnose(tmp_path, db, rule_dir, *settings, at=T0 + 20 * MINUTE)
    assert status(db)[0] == "open" and status(db, "unknown.node")[0] == "resolved"  # data back, not clear yet
    with Store(db) as store:
        for at in (T0 + 21 * MINUTE, T0 + 22 * MINUTE):
            healthy(store, "node03", at)
    diagnose(tmp_path, db, rule_dir, *settings, at=T0 + 22 * MINUTE)
    assert status(db)[0] == "resolved"
    assert [r.json()["text"] for r in hook.requests if "UNKNOWN" not in r.json()["text"]] == ["worn"]


def test_a_drained_finding_stays_open_when_its_data_turns_healthy_until_verify_resumes_it(
    tmp_path, db, slurm
):
    rule_dir = rule_file(tmp_path, worn_rule([{"type": "playbook", "playbook": "remediate/drain.yml"}]))
    env = {**os.environ, **slurm.env}
    settings = execute_args(tmp_path)
    with Store(db) as store:
        worn(store, "node03", at=T0)
    (finding,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0, env=env)
    with Store(db) as store:
        healthy(store, "node03", T0 + 20 * MINUTE)
        others_report(store, T0 + 20 * MINUTE)
    (later,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0 + 20 * MINUTE, env=env)
    assert status(db) == ("open", finding["txn_id"])  # reported open, as it is, until verify resumes it
    assert later["finding_id"] == finding["finding_id"] and "drained under txn" in later["outcome"]
    resumed = verify(db, "--node", "node03", "--txn", finding["txn_id"], "--resumed", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert status(db) == ("resolved", finding["txn_id"])


FAMILY = """
- rule_id: ssd_wear_trend
  description: reallocated sectors climbing (test)
  severity: warning
  family: ssd_wear
  trigger:
    - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 50, window: 5m, aggregate: last}
  action: ACTIONS_WARNING
- rule_id: ssd_wear_limit
  description: reallocated sectors past the limit (test)
  severity: critical
  family: ssd_wear
  trigger:
    - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 150, window: 5m, aggregate: last}
  action: ACTIONS_CRITICAL
"""


def test_a_family_escalation_shares_the_txn_and_runs_only_the_new_actions(tmp_path, db, http_standin):
    hook, jira = http_standin(), http_standin()
    ticket = {"type": "api_call", "endpoint": "{{ vars.jira }}/ticket", "payload": '{"s": "{{ rule_id }}"}'}
    warning = [ACTIONS["alert"], ticket]
    critical = [ACTIONS["alert"], ticket, {"type": "log", "message": "isolate {{ node_id }}"}]
    text = FAMILY.replace("ACTIONS_WARNING", json.dumps(warning)).replace(
        "ACTIONS_CRITICAL", json.dumps(critical)
    )
    rule_dir = rule_file(tmp_path, text)
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}", f"jira={jira.url}")
    with Store(db) as store:
        sectors(store, "node03", 80.0, T0)
    (first,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0)
    with Store(db) as store:
        sectors(store, "node03", 184.0, T0 + 10 * MINUTE)
    findings, _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0 + 10 * MINUTE)
    by_rule = {f["rule_id"]: f for f in findings}
    assert {f["txn_id"] for f in findings} == {first["txn_id"]}
    assert by_rule["ssd_wear_limit"]["outcome"].startswith("escalated warning -> critical")
    assert len(hook.requests) == 1  # the alert ran once, under the warning
    assert [r.json()["s"] for r in jira.requests] == ["ssd_wear_trend", "ssd_wear_limit"]
    assert {r.headers["Idempotency-Key"] for r in jira.requests} == {first["txn_id"]}  # one ticket, updated
    rows = table(db, "SELECT action, detail FROM DB.actions FINAL WHERE action IN ('escalate', 'log')")
    assert sorted(a for a, _ in rows) == ["escalate", "log"]
    escalation = json.loads(dict(rows)["escalate"])
    assert (escalation["from"], escalation["to"], escalation["runs"]) == (
        "warning",
        "critical",
        ["api_call", "log"],
    )


def test_the_cooldown_holds_only_a_reopen_after_a_resolve(tmp_path, db, http_standin):
    hook = http_standin()
    rule_dir = rule_file(tmp_path, worn_rule([ACTIONS["alert"]], cooldown="30m"))
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    # swept every minute; worn, healed for 10 minutes (resolved), worn again within the cooldown,
    # healed, and worn again 50 minutes after its last match
    worn_until = {0: worn, 10: healthy, 20: worn, 30: healthy, 65: healthy, 70: worn}
    txns, swept = [], -3
    for minute, state in worn_until.items():
        with Store(db) as store:
            for sweep in range(swept + 1, minute + 1):
                state(store, "node03", T0 + sweep * MINUTE)
        swept = minute
        found, _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0 + minute * MINUTE)
        txns += [f["txn_id"] for f in found]
    assert txns[0] == txns[1] and txns[2] != txns[0]
    assert len(hook.requests) == 2 and status(db) == ("open", txns[2])


def test_verify_reads_the_drain_reason_rule_of_a_family_txn_from_the_member_that_drained(store):
    from stethoscope.remediation.ledger import DRAIN, Ledger

    ledger = Ledger(store)
    member = {
        "txn_id": "famtxn000001", "node_id": "node03", "device": "sda", "confidence": 1.0, "level": "L4",
        "message": "", "evidence": "{}", "first_seen_ms": T0,
    }  # fmt: skip
    ledger.write_findings(
        [
            (
                {**member, "finding_id": "a", "rule_id": "ssd_wear_trend", "severity": "warning"},
                "open",
                1,
                T0,
            ),
            (
                {**member, "finding_id": "b", "rule_id": "ssd_wear_limit", "severity": "critical"},
                "open",
                1,
                T0,
            ),
        ]
    )
    row = {
        "txn_id": "famtxn000001", "finding_id": "b", "action": DRAIN, "target": "node03", "status": "ok",
        "detail": "{}", "started_at": T0, "finished_at": T0,
    }  # fmt: skip
    ledger.write_action(row, 1)
    assert ledger.rule_of_txn("famtxn000001") == "ssd_wear_limit"
