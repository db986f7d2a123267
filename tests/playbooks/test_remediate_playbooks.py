"""The remediation playbooks run by hand: dry-run by default (nothing drained, nothing collected,
nothing sent), the ticket's webhook backend with its idempotency key and no credential in the output,
and playbooks/diagnose.yml."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, ansible_env

BIN = Path(sys.executable).parent
FINDING = {"rule_id": "ssd_reallocated_sectors", "node_id": "node07", "device": "sda", "severity": "critical"}


def play(env, playbook, *extra):
    command = [
        str(BIN / "ansible-playbook"), "-i", str(TOP / "inventories/lab/hosts.yml"),
        str(TOP / "playbooks" / playbook), *extra,
    ]  # fmt: skip
    return subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, check=False)


def finding_vars(tmp_path):
    path = tmp_path / "vars.json"
    variables = {
        "stethoscope_txn_id": "abc123",
        "stethoscope_rule_id": FINDING["rule_id"],
        "stethoscope_finding": FINDING,
        "stethoscope_evidence_dir": str(tmp_path / "ev"),
    }
    path.write_text(json.dumps(variables))
    return f"@{path}"


def test_drain_and_evidence_are_dry_runs_by_default(tmp_path, tmp_dsn, slurm):
    env = ansible_env(tmp_path, tmp_dsn, **slurm.env)
    drain = play(env, "remediate/drain.yml", "--limit", "node07", "-e", finding_vars(tmp_path))
    assert drain.returncode == 0, drain.stdout[-2000:]
    assert "dry-run: would set node07 drained" in drain.stdout
    assert "DRAIN" not in slurm.node("node07")["state"]
    evidence = play(env, "remediate/evidence.yml", "--limit", "node07", "-e", finding_vars(tmp_path))
    assert evidence.returncode == 0 and "dry-run: would collect nvidia-smi_-q_-x" in evidence.stdout
    assert "sda" in evidence.stdout and not (tmp_path / "ev").exists()


def test_ticket_webhook_carries_the_finding_and_the_idempotency_key(tmp_path, tmp_dsn, http_standin):
    hook = http_standin()
    env = ansible_env(
        tmp_path, tmp_dsn, STETHOSCOPE_TICKET_USER="bot", STETHOSCOPE_TICKET_TOKEN="hunter2-secret"
    )
    result = play(
        env, "remediate/ticket.yml", "--limit", "node07", "-e", finding_vars(tmp_path),
        "-e", "stethoscope_ticket_backend=webhook", "-e", f"stethoscope_ticket_url={hook.url}/tickets",
        "-e", "stethoscope_remediate_execute=true", "-vvv",
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:]
    (request,) = hook.requests
    body = request.json()
    assert request.path == "/tickets" and request.headers["Idempotency-Key"] == "abc123"
    assert body["txn_id"] == "abc123" and body["finding"] == FINDING and body["node"] == "node07"
    assert body["summary"].startswith("[stethoscope] CRITICAL node07 sda: ssd_reallocated_sectors")
    assert body["baseline"].startswith("baseline comparison unavailable: ")  # no database: said, not fatal
    assert body["evidence_bundle"] == ""
    assert "hunter2-secret" not in result.stdout + result.stderr  # not even at -vvv


def test_ticket_refuses_to_run_without_a_destination(tmp_path, tmp_dsn):
    ticket = ["remediate/ticket.yml", "--limit", "node07", "-e", finding_vars(tmp_path)]
    # none configured: nothing to send to, said, and the host ends without failing (the executor
    # records the ticket `skipped` with that reason); a destination that is no URL fails
    unconfigured = play(ansible_env(tmp_path, tmp_dsn), *ticket)
    assert unconfigured.returncode == 0, unconfigured.stdout[-3000:]
    assert "node07: no ticket backend configured: stethoscope_ticket_url is empty" in unconfigured.stdout
    wrong = play(ansible_env(tmp_path, tmp_dsn), *ticket, "-e", "stethoscope_ticket_url=jira.example")
    assert wrong.returncode != 0 and "ticket needs ticket_url" in wrong.stdout


def test_diagnose_playbook_prints_findings_and_fails_on_critical(tmp_path, tmp_dsn):
    with Store(tmp_dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for ago in (120_000, 60_000, 1_000):
            batch.append("node07", "smart_reallocated_sector_ct", "sda", {}, 184.0, now_ms() - ago)
            batch.append("node07", "smart_media_wearout_indicator_normalized", "sda", {}, 8.0, now_ms() - ago)
        store.insert_metrics(batch)
    result = play(ansible_env(tmp_path, tmp_dsn), "diagnose.yml")
    assert result.returncode == 2  # the play failed on purpose: a critical finding
    assert "CRITICAL node07 sda: 184 reallocated sectors, media worn out" in result.stdout
    assert "findings at or above critical" in result.stdout
    quiet = play(ansible_env(tmp_path, tmp_dsn), "diagnose.yml", "-e", "diagnose_fail_on=critical",
                 "-e", f"diagnose_rules={TOP / 'rules/gpu'}")  # fmt: skip
    assert quiet.returncode == 0 and "healthy: no finding" in quiet.stdout


def test_a_second_ticket_run_of_one_txn_updates_the_issue_instead_of_opening_another(
    tmp_path, tmp_dsn, http_standin
):
    jira = http_standin()
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_TICKET_USER="bot", STETHOSCOPE_TICKET_TOKEN="t0ken")
    ticket = [
        "remediate/ticket.yml", "--limit", "node07", "-e", finding_vars(tmp_path),
        "-e", f"stethoscope_ticket_url={jira.url}", "-e", "stethoscope_remediate_execute=true",
    ]  # fmt: skip
    for _run in range(2):  # an escalation runs the ticket again under the same txn
        result = play(env, *ticket)
        assert result.returncode == 0, result.stdout[-3000:]
    assert list(jira.issues) == ["OPS-1"] and "already filed as OPS-1" in result.stdout
    (comment,) = [r for r in jira.requests if r.path.endswith("/comment")]
    assert comment.path == "/rest/api/2/issue/OPS-1/comment" and "node07" in comment.json()["body"]
