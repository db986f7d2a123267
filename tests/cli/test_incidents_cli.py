"""`stethoscope incidents [show|ack]` and `stethoscope actions`: one line an incident, an incident's
findings and every action with its attempts and why, the acknowledgement recorded, the actions
filtered; exit 2 for an unknown transaction or a bad option, 3 when the store fails, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_execute import db, diagnose, execute_args, rules, worn

from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute
AT = now_ms() - 3600_000


def cli(*args, dsn=None):
    command = [sys.executable, "-m", "stethoscope.cli", *(["--dsn", dsn] if dsn else []), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)


@pytest.fixture
def two_incidents(tmp_path, db, http_standin):
    """node03's worn SSD (its alert sent, its api_call failing) and node05's (its alert sent)."""
    hook, broken = http_standin(), http_standin(fail_first=100)
    call = {"type": "api_call", "endpoint": f"{broken.url}/v1/x", "payload": "{}", "retries": 0}
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}, call])
    with Store(db) as store:
        worn(store, "node03")
        worn(store, "node05")
    findings, _ = diagnose(
        tmp_path, db, rule_dir, *execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    )
    return {f["node_id"]: f["txn_id"] for f in findings}


def test_incidents_lists_one_line_each_and_show_tells_every_action_and_why(db, two_incidents):
    listed = cli("incidents", dsn=db)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:5] == ["TXN", "NODE", "DEVICE", "SEVERITY", "STATUS"] and len(lines) == 3
    for node, txn in two_incidents.items():
        (line,) = [x for x in lines if x.startswith(txn)]
        assert line.split()[:5] == [txn, node, "sda", "critical", "open"] and line.endswith("worn_ssd")
    only = cli("incidents", "--node", "node05", "--json", dsn=db)
    (entry,) = json.loads(only.stdout)
    assert (entry["txn_id"], entry["node_id"], entry["status"], entry["rules"]) == (
        two_incidents["node05"],
        "node05",
        "open",
        ["worn_ssd"],
    )

    shown = cli("incidents", "show", two_incidents["node03"], dsn=db)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.startswith(f"incident {two_incidents['node03']}: node03 sda, critical, open")
    assert "worn_ssd" in text and "node03 sda worn: 184 sectors" in text
    (call,) = [x for x in text.splitlines() if "api_call" in x]
    assert "failed" in call and "attempt 1 of 4 next at" in call and "HTTP 503" in call
    as_json = json.loads(cli("incidents", "show", two_incidents["node03"], "--json", dsn=db).stdout)
    by_action = {a["action"]: a for a in as_json["actions"]}
    assert by_action["alert"]["status"] == "ok" and by_action["api_call"]["why"] == "HTTP 503"
    assert [f["rule_id"] for f in as_json["findings"]] == ["worn_ssd"]


def test_actions_name_the_rule_each_acts_for(db, two_incidents):
    """An incident's actions for several rules read alike (`log planned` six times) without it."""
    lines = cli("actions", dsn=db).stdout.splitlines()
    assert len(lines) == 4 and all(line.split()[3] == "worn_ssd" for line in lines), lines
    entries = json.loads(cli("actions", "--json", dsn=db).stdout)
    assert {e["rule_id"] for e in entries} == {"worn_ssd"}


def test_ack_is_recorded_and_listed(db, two_incidents):
    txn = two_incidents["node03"]
    acked = cli("incidents", "ack", txn, "--by", "alice", "--note", "replacing the SSD", dsn=db)
    assert (
        acked.returncode == 0 and acked.stdout.strip() == f"incident {txn} (node03 sda) acknowledged by alice"
    )
    (line,) = [x for x in cli("incidents", dsn=db).stdout.splitlines() if x.startswith(txn)]
    assert line.split()[4] == "acknowledged"
    shown = cli("incidents", "show", txn, dsn=db).stdout
    (ack,) = [x for x in shown.splitlines() if " ack " in x]
    assert "by alice: replacing the SSD" in ack


def test_actions_filters_by_status_transaction_and_time(db, two_incidents):
    failed = cli("actions", "--status", "failed", dsn=db)
    lines = failed.stdout.splitlines()
    assert (
        failed.returncode == 0 and len(lines) == 2 and all("api_call" in x and "HTTP 503" in x for x in lines)
    )
    txn = two_incidents["node05"]
    entries = json.loads(cli("actions", "--txn", txn, "--json", dsn=db).stdout)
    assert {(e["txn_id"], e["action"], e["status"]) for e in entries} == {
        (txn, "alert", "ok"),
        (txn, "api_call", "failed"),
    }
    assert all(e["attempt"] == 1 for e in entries)
    assert len(cli("actions", "--since", "1h", dsn=db).stdout.splitlines()) == 4
    future = cli("actions", "--since", "2200-01-01T00:00:00Z", dsn=db)
    assert future.returncode == 0 and future.stdout.strip() == "no actions recorded matching"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("incidents", "show", "0123456789ab"), "no incident '0123456789ab'"),
        (("incidents", "ack", "0123456789ab"), "no incident '0123456789ab'"),
        (("actions", "--since", "someday"), "--since 'someday'"),
        (("actions", "--status", "done"), "invalid choice: 'done'"),
        (("incidents", "show"), "the following arguments are required: txn"),
    ],
)
def test_a_bad_argument_or_an_unknown_transaction_is_exit_2(db, args, said):
    result = cli(*args, dsn=db)
    assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr


def test_no_schema_is_exit_2_and_an_unreachable_store_exit_3(tmp_path):
    empty = cli("incidents", dsn=f"chdb://{tmp_path / 'empty'}")
    assert empty.returncode == 2 and "run `stethoscope db init` first" in empty.stderr
    down = cli("actions", dsn="http://127.0.0.1:9/stethoscope")
    assert down.returncode == 3 and "Traceback" not in down.stderr and down.stderr.startswith("stethoscope: ")


def test_actions_of_a_transaction_not_on_record_is_exit_2_as_incidents_show_is(db):
    """Regression guard (a fresh-clone trial): `actions --txn` of an unknown transaction said "no
    actions recorded matching" and exited 0, where README and `incidents show` say exit 2."""
    shown = cli("actions", "--txn", "deadbeef", dsn=db)
    assert shown.returncode == 2 and "deadbeef" in shown.stderr and "Traceback" not in shown.stderr
    assert cli("incidents", "--all", dsn=db).stdout.strip() == "no incidents recorded"
