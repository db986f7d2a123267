"""The operator sees the loop before and while it acts: `diagnose --plan` says per incident what
`--execute` would do now (a drain the circuit breaker refuses, and why; what runs; what is already
done) and writes nothing; `stethoscope breaker` shows the limits, what counts against them and the
refusals; serve --execute logs its first plan, one line per action, and counts the actions on
/metrics (every action and outcome from the start, at 0) with the breaker's gauges."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from test_breaker import drain_row, resume_row
from test_execute import db, execute_args, inventory, rules, table, worn

from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

__all__ = ["db"]
DRAIN = "playbook:remediate/drain.yml"
ACTIONS = [
    {"type": "log", "message": "{{ node_id }} worn"},
    {"type": "playbook", "playbook": "remediate/drain.yml"},
]
SECRET = b"plan-test-secret-0123456789abcdef"


def cli(db, *argv, check_rc=(0, 1), env=None):
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", db, *argv]
    result = subprocess.run(
        command, capture_output=True, text=True, cwd=TOP, timeout=300, check=False, env=env
    )
    assert result.returncode in check_rc, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result


def node01_isolated_node02_worn(db):
    """node01 is drained by stethoscope (the own limit of 8 nodes is 1); node02's SSD is worn."""
    with Store(db) as store:
        drain_row(store, "node01", "ok", now_ms() - 3600_000)
        worn(store, "node02", now_ms() - 5_000)


def steps(entries, node):
    (entry,) = [e for e in entries if e["node"] == node]
    return {s["action"] or s["will"]: s for s in entry["steps"]}


def test_the_plan_says_what_execute_would_do_and_writes_nothing(tmp_path, db):
    node01_isolated_node02_worn(db)
    rule_dir = str(rules(tmp_path, ACTIONS))
    args = execute_args(tmp_path)[1:]  # the inventory and settings, without --execute
    plan = cli(db, "diagnose", "--no-model", "--plan", "--json", "--rules", rule_dir, *args)
    said = steps(json.loads(plan.stdout), "node02")
    assert said["drain"]["will"] == "refused by the breaker"
    assert "own limit: 1 of 8 nodes isolated now by stethoscope (node01)" in said["drain"]["why"]
    assert said["log"]["will"] == "runs"
    assert table(db, "SELECT count() FROM DB.findings") == [(0,)]  # the plan wrote nothing
    assert table(db, "SELECT count() FROM DB.actions") == [(1,)]  # node01's drain only
    assert not (tmp_path / "findings.log").exists()
    text = cli(db, "diagnose", "--no-model", "--plan", "--rules", rule_dir, *args).stdout
    assert "node02 worn_ssd [critical] new incident" in text and "drain: refused by the breaker" in text

    done = cli(db, "diagnose", "--no-model", "--json", "--rules", rule_dir, "--execute", *args)
    (finding,) = json.loads(done.stdout)
    assert finding["outcome"] == f"log ok, {DRAIN} refused"  # as the plan said
    assert f"action {DRAIN} refused: node node02 rule worn_ssd txn {finding['txn_id']}" in done.stderr
    assert f"action log ok: node node02 rule worn_ssd txn {finding['txn_id']}" in done.stderr
    again = json.loads(
        cli(db, "diagnose", "--no-model", "--plan", "--json", "--rules", rule_dir, *args).stdout
    )
    (entry,) = [e for e in again if e["node"] == "node02"]
    assert entry["txn_id"] == finding["txn_id"] and not entry["new"]
    (still,) = entry["steps"]  # the log is done; the refused drain waits for room in the breaker
    assert (still["action"], still["will"]) == ("drain", "refused by the breaker") and "own limit" in still[
        "why"
    ]

    state = json.loads(cli(db, "breaker", "--json", *args, check_rc=(0,)).stdout)
    own, out = state["limits"]["own"], state["limits"]["out_of_service"]
    assert (own["count"], own["limit"], own["nodes"]) == (1, 1, ["node01"])
    assert own["rule"] == "max(1, floor(0.1 x 8))" and out["limit"] == 2
    (refused,) = state["refusals"]
    assert refused["node"] == "node02" and refused["txn_id"] == finding["txn_id"]
    assert "own limit" in refused["reason"]
    text = cli(db, "breaker", *args, check_rc=(0,)).stdout
    assert re.search(r"own isolations +1 of 1 .* node01", text) and "refused within 24h: 1" in text


def test_plan_and_breaker_without_an_inventory_are_exit_2(tmp_path, db):
    rule_dir = str(rules(tmp_path, ACTIONS))
    for argv in (("diagnose", "--no-model", "--plan", "--rules", rule_dir), ("breaker",)):
        result = cli(db, *argv, check_rc=(2,))
        assert "inventory" in result.stderr


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_serve_logs_its_plan_each_action_and_counts_them_on_metrics(tmp_path, db):
    node01_isolated_node02_worn(db)
    rule_dir = rules(tmp_path, ACTIONS)
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    hosts = inventory(tmp_path)  # serve starts only for an inventory with a node that streams
    hosts.write_text(hosts.read_text().replace("node01: {", "node01: {stethoscope_node_key: 1, "))
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", db, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--no-model", "--no-sweep", "--secret-file", str(secret), "--listen", "127.0.0.1:0",
        "--http", "127.0.0.1:0", "--interval", "2", "--rules", str(rule_dir), "--log-format", "json",
        "--execute", "--inventory", str(hosts), "-e", f"stethoscope_diagnose_log={tmp_path / 'findings.log'}",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    out: list[str] = []
    err: list[str] = []
    families = {}
    try:
        assert proc.stdout is not None and proc.stderr is not None
        head = proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz", head)
        assert match, head + (proc.stderr.read() if proc.poll() is not None else "")
        threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
        threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
        first = {s.name: s.value for f in text_string_to_metric_families(_get(f"{match[1]}/metrics"))
                 for s in f.samples if f.name == "stethoscope_actions"}  # fmt: skip
        deadline = time.time() + 180
        while time.time() < deadline:
            families = {f.name: f for f in text_string_to_metric_families(_get(f"{match[1]}/metrics"))}
            counted = {
                (s.labels["action"], s.labels["outcome"]): s.value
                for s in families["stethoscope_actions"].samples
            }
            if counted[("drain", "refused")] >= 1 and counted[("log", "ok")] >= 1:
                break
            time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert first and set(first.values()) == {0.0}  # every combination present from the start, at 0
    assert counted[("drain", "refused")] == 1 and counted[("log", "ok")] == 1
    assert counted[("ticket", "failed")] == 0 and len(counted) >= 8 * 6
    gauges = {
        (f, s.labels["limit"]): s.value
        for f in ("stethoscope_breaker_isolated", "stethoscope_breaker_limit")
        for s in families[f].samples
    }
    assert gauges[("stethoscope_breaker_isolated", "own")] == 1
    assert gauges[("stethoscope_breaker_limit", "own")] == 1
    assert gauges[("stethoscope_breaker_limit", "out_of_service")] == 2
    records = [json.loads(line) for line in out if line.startswith("{")]
    (plan,) = [r for r in records if r["event"] == "plan"]  # the first executing cycle's only
    said = steps(plan["incidents"], "node02")
    assert said["drain"]["will"] == "refused by the breaker" and said["log"]["will"] == "runs"
    actions = [json.loads(line) for line in err if line.startswith("{")]
    refused = [a for a in actions if a.get("event") == "action" and a["action"] == DRAIN]
    assert refused and refused[0]["outcome"] == "refused" and refused[0]["node"] == "node02"
    assert refused[0]["rule"] == "worn_ssd" and refused[0]["txn"] and "own limit" in refused[0]["why"]
    assert any(a.get("action") == "log" and a["outcome"] == "ok" for a in actions)


def test_an_action_log_line_shows_playbook_and_slurm_text_as_written():
    """Regression: an action's reason carries a playbook's and Slurm's text, printed raw: an escape
    sequence in it reached the operator's terminal."""
    from stethoscope.remediation.action_events import ActionEvent

    why = "scontrol: \x1b[2J\x1b]0;owned\x07\nnext"
    event = ActionEvent(DRAIN, "failed", "node02", "worn_ssd", "txn1", why)
    line = event.text()
    assert "\x1b" not in line and "\x07" not in line and "\n" not in line
    assert "\\x1b[2J" in line and line.startswith(f"action {DRAIN} failed: node node02")


def test_the_plan_says_silenced_retry_due_and_needs_a_person(tmp_path, db, http_standin):
    """node03 is silenced; node02's api_call fails (its endpoint answers 503): the plan says its
    retry is due once the backoff passed, and, when the last attempt failed and no person was asked
    (an executor killed before it could ask), that the incident needs a person."""
    from stethoscope.store.batch import MetricColumns

    hook = http_standin(fail_first=1000)
    with Store(db) as store:
        worn(store, "node02", now_ms() - 5_000)
        batch = MetricColumns()
        batch.append("node03", "smart_reallocated_sector_ct", "sda", {}, 184.0, now_ms() - 2_000)
        batch.append("node03", "smart_media_wearout_indicator_normalized", "sda", {}, 8.0, now_ms() - 2_000)
        store.insert_metrics(batch)
    call = {"type": "api_call", "endpoint": hook.url, "payload": "{}", "retries": 0, "timeout": 5}
    rule_dir = str(rules(tmp_path, [call]))
    settings = ("stethoscope_action_retries=1", "stethoscope_action_backoff=1")
    args = execute_args(tmp_path, *settings)[1:]
    cli(db, "silence", "add", "--node", "node03", "--for", "1h", "--reason", "disk swap", check_rc=(0,))

    def plan():
        return json.loads(
            cli(db, "diagnose", "--no-model", "--plan", "--json", "--rules", rule_dir, *args).stdout
        )

    first = plan()
    assert steps(first, "node02")["api_call"]["will"] == "runs"
    silenced = steps(first, "node03")["silenced"]
    assert "disk swap" in silenced["why"]

    def execute():
        cli(db, "diagnose", "--no-model", "--json", "--rules", rule_dir, "--execute", *args)
        time.sleep(1.5)  # past the backoff of 1 s

    execute()  # attempt 1 of 2 fails
    due = steps(plan(), "node02")["api_call"]
    assert (due["will"], due["why"]) == ("retry due", "attempt 2 of 2 after failed")
    execute()  # attempt 2 of 2 fails: a person is asked at once
    assert "needs a person" not in json.dumps(plan())
    with Store(db) as store:  # as an executor killed between the last failure and the asking leaves it
        store.command(
            f"ALTER TABLE {store.database}.actions DELETE WHERE action = 'needs_person' "
            "SETTINGS mutations_sync = 2"
        )
    asked = steps(plan(), "node02")["api_call"]
    assert (asked["will"], asked["why"]) == ("needs a person", "failed")
    assert "node03" not in {r[0] for r in table(db, "SELECT target FROM DB.actions")}  # silenced: nothing ran
    assert len([r for r in hook.requests if r.method == "POST"]) == 2


def test_execute_drains_the_node_the_plan_said_when_the_breaker_has_room_for_one(
    tmp_path, db, http_standin, slurm
):
    """Two worn nodes, room for one drain (own limit 1 of 8): the plan admits the first in its order
    (node02). --execute runs the incidents side by side, and node02's incident first calls an endpoint
    that answers late: node03's drain reaches the breaker first, yet the breaker gives its room in the
    plan's order, so execute drains node02 as the plan said and refuses node03."""
    hook = http_standin(slow_paths={"/node02": 2.0})
    with Store(db) as store:
        worn(store, "node02", now_ms() - 5_000)
        worn(store, "node03", now_ms() - 5_000)
    call = {"type": "api_call", "endpoint": hook.url + "/{{ node_id }}", "payload": "{}", "timeout": 10}
    rule_dir = str(rules(tmp_path, [call, {"type": "playbook", "playbook": "remediate/drain.yml"}]))
    args, env = execute_args(tmp_path)[1:], {**os.environ, **slurm.env}
    plan = cli(db, "diagnose", "--no-model", "--plan", "--json", "--rules", rule_dir, *args, env=env)
    assert steps(json.loads(plan.stdout), "node02")["drain"]["will"] == "runs"
    assert steps(json.loads(plan.stdout), "node03")["drain"]["will"] == "refused by the breaker"

    done = cli(db, "diagnose", "--no-model", "--json", "--rules", rule_dir, "--execute", *args, env=env)
    outcomes = {f["node_id"]: f["outcome"] for f in json.loads(done.stdout)}
    assert outcomes["node02"] == f"api_call ok, {DRAIN} ok", done.stderr
    assert f"{DRAIN} refused" in outcomes["node03"], done.stderr


def test_a_drain_the_plan_refused_stays_refused_while_its_work_waits_past_the_next_cycle():
    """serve: incidents queued in one cycle ask the breaker in a later one, whose plan no longer names
    them; the earlier plan's order still holds (node02 was admitted, node03 refused)."""
    from stethoscope.remediation.breaker import CircuitBreaker

    breaker = CircuitBreaker(fleet_size=8)  # room for one isolation
    verdicts = breaker.admit(["node02", "node03"])
    assert verdicts["node02"][0] and not verdicts["node03"][0]
    breaker.admit([])  # the next cycle plans no drain
    assert not breaker.permit("node03")[0]
    assert breaker.permit("node02")[0]
    assert breaker.admit(["node03"])["node03"] == (
        False,
        breaker.room("node03")[1],
    )  # judged again: still full


def test_a_refusal_stays_listed_after_the_drain_is_tried_again(tmp_path, db):
    """The drain's own row changes when it is retried (here it then fails: no Slurm); the refusal
    keeps a row of its own, so `breaker` and `actions --status refused` still show it."""
    node01_isolated_node02_worn(db)
    rule_dir = str(rules(tmp_path, ACTIONS))
    args = execute_args(tmp_path)[1:]
    cli(db, "diagnose", "--no-model", "--json", "--rules", rule_dir, "--execute", *args)  # refused
    with Store(db) as store:
        resume_row(store, "node01", now_ms())  # room again: the next cycle tries node02's drain
    retried = cli(db, "diagnose", "--no-model", "--json", "--rules", rule_dir, "--execute", *args)
    assert f"action {DRAIN} failed: node node02" in retried.stderr, retried.stderr
    (refusal,) = json.loads(cli(db, "breaker", "--json", *args, check_rc=(0,)).stdout)["refusals"]
    assert refusal["node"] == "node02" and "own limit" in refusal["reason"]
    listed = cli(db, "actions", "--status", "refused", check_rc=(0,)).stdout
    assert "node02" in listed and "breaker_refusal" in listed
    # the breaker of another inventory sharing the store lists only its own nodes' refusals
    other = tmp_path / "other" / "hosts.yml"
    other.parent.mkdir()
    other.write_text("all:\n  hosts:\n    gpu-a01: {slurm_name: a01}\n    gpu-a02: {slurm_name: a02}\n")
    theirs = json.loads(cli(db, "breaker", "--json", "--inventory", str(other), check_rc=(0,)).stdout)
    assert theirs["refusals"] == [] and theirs["fleet_size"] == 2


def test_an_action_without_a_rule_says_no_empty_rule():
    """A verify or an expired drain acts for an incident, not a rule: its line names no empty rule
    (it read `node node04 rule  txn ...`)."""
    from stethoscope.remediation.action_events import ActionEvent

    line = ActionEvent(
        "playbook:remediate/verify.yml", "failed", "node04", "", "txn7", "still matches"
    ).text()
    assert line == "action playbook:remediate/verify.yml failed: node node04 txn txn7; still matches"


def test_the_plan_names_each_incidents_device():
    """Two incidents of one rule on one node (two GPUs, two drives) read as duplicates without it."""
    from stethoscope.remediation.plan import render_plan

    entries = [
        {
            "node": "node01",
            "rule_id": "gemm_below_fleet",
            "device": device,
            "severity": "warning",
            "new": True,
            "txn_id": "",
            "steps": [{"action": "log", "label": "log", "will": "runs", "why": ""}],
        }
        for device in ("cpu0", "cpu1")
    ] + [
        {
            "node": "node02",
            "rule_id": "host_silent",
            "device": "",
            "severity": "critical",
            "new": False,
            "txn_id": "t2",
            "steps": [],
        }
    ]
    lines = render_plan(entries).splitlines()
    assert "node01 gemm_below_fleet [warning] new incident, device cpu0" in lines
    assert "node01 gemm_below_fleet [warning] new incident, device cpu1" in lines
    assert "node02 host_silent [critical] txn t2" in lines
