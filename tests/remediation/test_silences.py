"""Silences, maintenance and ack: a finding an active silence or a Slurm maintenance
reservation matches takes no action and is recorded as `silenced`; once the silence ends the rule's
next match acts as a new finding would; an acknowledged incident's retries and alerts wait until it
escalates or is un-acknowledged; a bad matcher, duration or silence id is exit 2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest
from test_action_retries import MINUTE, api_call, cycle, start
from test_execute import db, diagnose, execute_args, rules, table, worn
from test_rule_failures import HOT, rule_dir, seed

from stethoscope.remediation.ledger import ESCALATE, Ledger, note_row
from stethoscope.remediation.silences import Matcher, Silence, parse_matcher, silencing
from stethoscope.remediation.slurm_reservations import expand_hostlist, maintenance_of, parse_reservations
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute

# `scontrol -o show reservation`, Slurm 22.05 (Debian bookworm), the lab's slurmctld: a maintenance
# reservation active now, one that starts later, and an ordinary one
SHOW_RESERVATION = (
    "ReservationName=maint1 StartTime=2026-12-06T07:05:45 EndTime=2026-12-06T08:05:45 Duration=01:00:00 "
    "Nodes=node[03-04] NodeCnt=2 CoreCnt=2 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES "
    "TRES=cpu=2 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) "
    "Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=later StartTime=2026-12-06T09:05:45 EndTime=2026-12-06T10:05:45 Duration=01:00:00 "
    "Nodes=node05 NodeCnt=1 CoreCnt=1 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES "
    "TRES=cpu=1 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE "
    "BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=plain StartTime=2026-12-06T07:05:45 EndTime=2026-12-06T08:05:45 Duration=01:00:00 "
    "Nodes=node06 NodeCnt=1 CoreCnt=1 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=1 "
    "Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE BurstBuffer=(null) Watts=n/a "
    "MaxStartDelay=(null)\n"
)


def cli(*args, dsn=None, env=None):
    command = [sys.executable, "-m", "stethoscope.cli", *(["--dsn", dsn] if dsn else []), *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, env=env, check=False)


def silence(db, *args):
    added = cli("silence", "add", *args, dsn=db)
    assert added.returncode == 0, added.stderr
    return added.stdout.strip()


def statuses(db):
    return table(db, "SELECT node_id, status FROM DB.findings FINAL ORDER BY node_id")


def test_a_silenced_nodes_critical_finding_takes_no_action_and_acts_once_the_silence_expires(
    tmp_path, db, http_standin
):
    hook = http_standin()
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    silence_id = silence(db, "--node", "node03", "--for", "4h", "--reason", "SSD swap", "--by", "alice")
    listed = cli("silence", "list", dsn=db)
    assert listed.returncode == 0 and silence_id in listed.stdout and "node_id=node03" in listed.stdout
    assert "alice" in listed.stdout and "SSD swap" in listed.stdout

    t0 = start()
    quiet = cycle(tmp_path, db, rule_dir, settings, t0, "node03")["node03"]
    assert quiet["outcome"] == f"silenced by {silence_id}: SSD swap: no action"
    assert quiet["silenced"] == f"{silence_id}: SSD swap"
    assert hook.requests == [] and table(db, "SELECT count() FROM DB.actions")[0][0] == 0
    assert statuses(db) == [("node03", "silenced")]

    expired = cli("silence", "expire", silence_id, dsn=db)
    assert expired.returncode == 0, expired.stderr
    assert silence_id not in cli("silence", "list", dsn=db).stdout
    (entry,) = json.loads(cli("silence", "list", "--all", "--json", dsn=db).stdout)
    assert entry["silence_id"] == silence_id and entry["matchers"] == ["node_id=node03"]

    acting = cycle(tmp_path, db, rule_dir, settings, t0 + MINUTE, "node03")["node03"]
    assert acting["outcome"] == "alert ok" and len(hook.requests) == 1 and acting["txn_id"]
    assert statuses(db) == [("node03", "open")]


def test_matchers_are_anded_and_a_regex_is_anchored():
    finding = {"node_id": "node03", "rule_id": "worn_ssd", "device": "sda", "severity": "critical"}
    both = Silence(
        "s1", (parse_matcher("rule_id=~worn.*"), Matcher("node_id", "=", "node03")), 0, 10, "a", "r"
    )
    other_device = Silence(
        "s2", (parse_matcher("rule_id=worn_ssd"), parse_matcher("device=sdb")), 0, 10, "a", "r"
    )
    unanchored = Silence("s3", (parse_matcher("node_id=~ode0"),), 0, 10, "a", "r")
    assert silencing(finding, [other_device, unanchored, both], {}, 5) == "s1: r"
    assert silencing(finding, [other_device, unanchored], {}, 5) is None
    assert silencing(finding, [both], {}, 10) is None  # ended
    assert silencing(finding, [], {"node03": ("maint1", 10)}, 5).startswith("maintenance maint1: Slurm maint")


def test_scontrol_reservations_are_parsed_and_hostlists_expanded():
    active, later, plain = parse_reservations(SHOW_RESERVATION)
    assert (active.name, active.maintenance, active.active, active.nodes) == (
        "maint1",
        True,
        True,
        ("node03", "node04"),
    )
    assert (later.active, plain.maintenance) == (False, False)
    assert expand_hostlist("gpu[1-2,09-10]-x,login") == ["gpu1-x", "gpu2-x", "gpu09-x", "gpu10-x", "login"]
    with pytest.raises(ValueError):
        expand_hostlist("node[03-")


def test_one_reservation_line_not_understood_is_skipped_and_said_the_others_still_hold(capsys):
    """One unparsable line took every node's maintenance away (read_maintenance: None, fail open)."""
    bad = "ReservationName=odd StartTime=x EndTime=yesterday Nodes=node[07- Flags=MAINT State=ACTIVE\n"
    held = maintenance_of(bad + SHOW_RESERVATION)
    assert sorted(held) == ["node03", "node04"] and held["node03"][0] == "maint1"
    said = capsys.readouterr().err
    assert "at line 1" in said and "skipped" in said and said.count("\n") == 1


def test_a_node_in_a_slurm_maintenance_reservation_is_silenced(tmp_path, db, http_standin, slurm):
    hook = http_standin()
    env = {**os.environ, **slurm.env}
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    name = f"maint_{os.getpid()}"
    made = slurm.scontrol(
        "create", "reservation", f"reservationname={name}", "flags=maint", "nodes=node03",
        "starttime=now", "duration=60", "user=root",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        with Store(db) as store:
            worn(store, "node03", at=now_ms() - 5_000)
        (finding,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=now_ms() - 5_000, env=env)
    finally:
        slurm.scontrol("delete", f"reservationname={name}")
    assert finding["outcome"].startswith(f"silenced by maintenance {name}: Slurm maintenance until ")
    assert hook.requests == [] and statuses(db) == [("node03", "silenced")]


def test_the_plan_sees_the_maintenance_execute_would_through_its_slurm_environment(tmp_path, db, slurm):
    """`diagnose --plan` silenced without the execution context: Slurm asked as the process is set up,
    not through stethoscope_slurm_environment, so a node in maintenance was planned to act."""
    rule_dir = rules(tmp_path, [{"type": "log", "message": "worn"}])
    settings = execute_args(tmp_path)[1:]  # the inventory and settings, without --execute
    hosts = tmp_path / "inventory" / "hosts.yml"  # Slurm reached through the setting only
    hosts.write_text(
        hosts.read_text().replace(
            "  vars:\n", f"  vars:\n    stethoscope_slurm_environment: {json.dumps(slurm.env)}\n", 1
        )
    )
    name = f"maint_{os.getpid()}_plan"
    made = slurm.scontrol(
        "create", "reservation", f"reservationname={name}", "flags=maint", "nodes=node03",
        "starttime=now", "duration=60", "user=root",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        with Store(db) as store:
            worn(store, "node03", at=now_ms() - 5_000)
        planned = cli(
            "diagnose", "--no-model", "--plan", "--json", "--rules", str(rule_dir), *settings, dsn=db
        )
    finally:
        slurm.scontrol("delete", f"reservationname={name}")
    assert planned.returncode in (0, 1), planned.stderr
    (entry,) = [e for e in json.loads(planned.stdout) if e["node"] == "node03"]
    assert [s["will"] for s in entry["steps"]] == ["silenced"], entry


def test_a_silence_over_an_open_incident_rejoins_it_on_release_without_acting_again(
    tmp_path, db, http_standin
):
    """A silence over an open incident, once expired, opened a new txn: a second alert (and ticket,
    drain); while silenced its first_seen was reset under the old txn (negative outcome minutes)."""
    hook = http_standin()
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}])
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    t0 = start()
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node03")["node03"]
    assert first["outcome"] == "alert ok" and len(hook.requests) == 1
    silence_id = silence(db, "--node", "node03", "--for", "4h", "--reason", "swap")
    quiet = cycle(tmp_path, db, rule_dir, settings, t0 + MINUTE, "node03")["node03"]
    assert quiet["txn_id"] == first["txn_id"] and quiet["first_seen"] == first["first_seen"]
    assert cli("silence", "expire", silence_id, dsn=db).returncode == 0
    again = cycle(tmp_path, db, rule_dir, settings, t0 + 2 * MINUTE, "node03")["node03"]
    assert again["txn_id"] == first["txn_id"] and again["first_seen"] == first["first_seen"]
    assert len(hook.requests) == 1 and "no new action" in again["outcome"]
    assert statuses(db) == [("node03", "open")]


def test_a_silenced_nodes_incident_retries_nothing_through_a_finding_that_stopped_matching(
    tmp_path, db, http_standin
):
    """Only the matched findings were silenced: an incident whose finding stopped matching (held open,
    stale) kept retrying its failed notification, and alerted that it needs a person, on a node
    under a silence or in maintenance."""
    t0 = start()
    switch_api = http_standin(fail_first=100)
    rule_dir = rules(tmp_path, [api_call(switch_api.url)])
    settings = execute_args(tmp_path)
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node03")["node03"]
    assert first["outcome"] == "api_call failed" and len(switch_api.requests) == 1
    silence(db, "--node", "node03", "--for", "4h", "--reason", "swap")
    for minutes in (6, 20, 60):
        later = cycle(tmp_path, db, rule_dir, settings, t0 + minutes * MINUTE, silent="node03")
        assert "node03" not in later
    assert len(switch_api.requests) == 1
    needs = "SELECT count() FROM DB.actions FINAL WHERE action = 'needs_person'"
    assert table(db, needs)[0][0] == 0


def test_ack_pauses_the_retries_until_unack(tmp_path, db, http_standin):
    t0 = start()
    switch_api = http_standin(fail_first=100)
    rule_dir = rules(tmp_path, [api_call(switch_api.url)])
    settings = execute_args(tmp_path)
    first = cycle(tmp_path, db, rule_dir, settings, t0, "node03")["node03"]
    assert first["outcome"] == "api_call failed" and len(switch_api.requests) == 1
    txn = first["txn_id"]
    assert cli("incidents", "ack", txn, "--by", "alice", dsn=db).returncode == 0

    paused = cycle(tmp_path, db, rule_dir, settings, t0 + 6 * MINUTE, "node03")["node03"]
    assert len(switch_api.requests) == 1 and "acknowledged by alice" in paused["outcome"]
    (line,) = [x for x in cli("incidents", dsn=db).stdout.splitlines() if x.startswith(txn)]
    assert "acknowledged by alice" in line
    assert "acknowledged by alice" in cli("incidents", "show", txn, dsn=db).stdout

    unacked = cli("incidents", "unack", txn, dsn=db)
    assert unacked.returncode == 0 and "no longer acknowledged" in unacked.stdout
    retried = cycle(tmp_path, db, rule_dir, settings, t0 + 7 * MINUTE, "node03")["node03"]
    assert len(switch_api.requests) == 2 and "retried api_call failed (attempt 2 of 4)" in retried["outcome"]


ESCALATING = """
- rule_id: gpu_hot
  description: hot GPU (test)
  severity: warning
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m, aggregate: last}
  action: ACTIONS
- rule_id: gpu_dbe
  description: double-bit ECC (test)
  severity: critical
  trigger:
    - {metric: gpu_ecc_uncorrected_volatile_total, operator: ">", threshold: 0, window: 5m, aggregate: last}
  action: [{type: log, message: dbe}]
"""


def test_an_escalation_ends_the_pause_of_an_acknowledged_incident(tmp_path, db, http_standin):
    from stethoscope.store.batch import MetricColumns

    t0 = start()
    switch_api = http_standin(fail_first=100)
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "gpu.yml").write_text(
        textwrap.dedent(ESCALATING).replace("ACTIONS", json.dumps([api_call(switch_api.url)]))
    )
    settings = execute_args(tmp_path)

    def hot(at, dbe=False):
        with Store(db) as store:
            batch = MetricColumns()
            for node in (f"node0{i}" for i in range(1, 9)):
                batch.append(
                    node, "gpu_temperature_celsius", "gpu0", {}, 90.0 if node == "node03" else 40.0, at
                )
            if dbe:
                batch.append("node03", "gpu_ecc_uncorrected_volatile_total", "gpu0", {}, 1.0, at)
            store.insert_metrics(batch)
        findings, _ = diagnose(tmp_path, db, folder, *settings, at=at)
        return {f["rule_id"]: f for f in findings}

    txn = hot(t0)["gpu_hot"]["txn_id"]
    assert cli("incidents", "ack", txn, "--by", "alice", dsn=db).returncode == 0
    hot(t0 + 6 * MINUTE)
    assert len(switch_api.requests) == 1
    escalated = hot(t0 + 7 * MINUTE, dbe=True)
    assert escalated["gpu_dbe"]["outcome"].startswith(f"escalated warning -> critical under txn {txn}")
    assert len(switch_api.requests) == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("add", "--for", "4h", "--reason", "x"), "at least one of --node, --rule, --match"),
        (("add", "--match", "owner=bob", "--for", "4h", "--reason", "x"), "--match 'owner=bob'"),
        (("add", "--match", "node_id=~node[", "--for", "4h", "--reason", "x"), "not a regular expression"),
        (("add", "--node", "node03", "--for", "soon", "--reason", "x"), "--for 'soon'"),
        (("add", "--node", "node03", "--for", "4h", "--reason", " "), "--reason"),
        (("add", "--node", "node03", "--for", "4h"), "the following arguments are required: --reason"),
        (("expire", "0123456789ab"), "no silence '0123456789ab'"),
        (("add", "--node", "node03", "--node", "node04", "--for", "4h", "--reason", "x"), "never both match"),
        (("add", "--rule", "a", "--match", "rule_id=b", "--for", "4h", "--reason", "x"), "never both match"),
    ],
)
def test_bad_silence_input_is_exit_2(db, args, said, capsys):
    from stethoscope.cli.main import main

    try:
        code = main(["--dsn", db, "silence", *args])
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and said in err and "Traceback" not in err


def test_metrics_leave_silenced_findings_and_incidents_out_of_the_open_ones(tmp_path, tmp_dsn):
    """/metrics counted a silenced finding as open (stethoscope_findings_open, _incidents_open):
    a node in maintenance paged whoever alerts on those gauges."""
    seed(tmp_dsn, ("gpu-a", "gpu_temperature_celsius", "gpu0", 95.0))
    seed(tmp_dsn, ("gpu-b", "gpu_temperature_celsius", "gpu0", 95.0))
    silence(tmp_dsn, "--node", "gpu-a", "--for", "1h", "--reason", "swap")
    secret, inventory = tmp_path / "cluster.secret", tmp_path / "hosts.yml"
    secret.write_bytes(b"silence-metrics-secret-0123456789\n")
    inventory.write_text(
        "---\nall:\n  hosts:\n    gpu-a: {stethoscope_node_key: 1}\n    gpu-b: {stethoscope_node_key: 2}\n"
    )
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-sweep", "--no-model",
        "--rules", str(rule_dir(tmp_path, hot=HOT)), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
        "--interval", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    hot_b = 'stethoscope_findings_open{node="gpu-b",rule_id="gpu_hot",severity="critical"} 1.0'
    metrics = ""
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz", head)
        assert match, head + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        deadline = time.time() + 90
        while time.time() < deadline and hot_b not in metrics:
            with urllib.request.urlopen(f"{match[1]}/metrics", timeout=10) as response:
                metrics = response.read().decode()
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert hot_b in metrics
    assert 'node="gpu-a"' not in metrics.split("stethoscope_cycles")[0]


def known(fid: str, txn: str, status: str) -> tuple[dict, str, int, int]:
    at = now_ms() - 600_000
    finding = {
        "finding_id": fid, "txn_id": txn, "rule_id": "worn_ssd", "node_id": "node03", "device": "sda",
        "severity": "critical", "confidence": 1.0, "level": "L2", "message": "worn", "evidence": "{}",
        "first_seen_ms": at,
    }  # fmt: skip
    return finding, status, 1, at + 60_000


def test_incidents_say_silenced_an_escalated_ack_reads_open_and_an_empty_txn_is_refused(db):
    """An incident whose findings were all silenced read `open`; one escalated after its ack read
    `open` with "acknowledged by X, escalated since"; `incidents show ""` took every dry-run finding
    for one incident."""
    with Store(db) as store:
        Ledger(store).write_findings(
            [known("f1", "tx-quiet", "silenced"), known("f2", "tx-loud", "open"), known("f3", "", "open")]
        )
    assert cli("incidents", "ack", "tx-loud", "--by", "alice", dsn=db).returncode == 0
    with Store(db) as store:
        row = {**note_row("tx-loud", ESCALATE, "node03", {"from": "warning", "to": "critical"})}
        row["started_at"] = row["finished_at"] = row["started_at"] + 1000
        Ledger(store).write_action(row, row["finished_at"])
    listed = {line.split()[0]: line for line in cli("incidents", dsn=db).stdout.splitlines()[1:]}
    assert listed["tx-quiet"].split()[4] == "silenced"
    assert listed["tx-loud"].split()[4] == "open" and "open again" in listed["tx-loud"]
    for command in ("show", "ack", "unack"):
        refused = cli("incidents", command, "", dsn=db)
        assert refused.returncode == 2 and "empty transaction id" in refused.stderr, refused.stderr


def test_silence_list_keeps_its_columns_whatever_their_widths(db):
    """A long creator or end time pushed the next columns out of line under their headers."""
    silence(db, "--node", "node03", "--for", "4h", "--reason", "SSD swap", "--by", "alice")
    silence(db, "--rule", "worn_ssd", "--for", "2d", "--reason", "RMA", "--by", "operations-night-shift")
    header, *rows = cli("silence", "list", dsn=db).stdout.splitlines()
    assert len(rows) == 2
    starts = [match.start() for match in re.finditer(r"\S+", header)]
    for row in rows:  # each header word starts a column: the row has a word starting there, after a gap
        assert all(row[at] != " " and (at == 0 or row[at - 1] == " ") for at in starts), (header, row)
