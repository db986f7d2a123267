"""`diagnose --execute`: transactions, the actions table, log/alert/api_call against real loopback
servers (retries carry one idempotency key), the circuit breaker against a real
slurmctld, and the refusals (dry-run writes nothing, a name outside the inventory never reaches a
playbook, a template error fails only its action)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

AT = now_ms() - 5_000
NODES = [f"node0{i}" for i in range(1, 9)]


def inventory(tmp_path):
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir(exist_ok=True)
    hosts = "\n".join(f"        {n}: {{slurm_name: {n}}}" for n in NODES)
    head = "---\nall:\n  vars:\n    ansible_connection: local\n  children:\n    gpu_nodes:\n      hosts:\n"
    path.write_text(f"{head}{hosts}\n")
    return path


def worn(store, node, at=AT):
    """`node`'s SSD worn out at `at`; the rest of the inventory reports healthy at that instant (seven
    nodes that never said anything would be UNKNOWN, the fleet: test_unknown covers that)."""
    batch = MetricColumns()
    batch.append(node, "smart_reallocated_sector_ct", "sda", {}, 184.0, at)
    batch.append(node, "smart_media_wearout_indicator_normalized", "sda", {}, 8.0, at)
    store.insert_metrics(batch)
    others_report(store, at, besides=node)


def others_report(store, at, besides="node03"):
    """The rest of the inventory reports too: seven nodes that say nothing are UNKNOWN (the fleet)."""
    batch = MetricColumns()
    for node in NODES:
        if node != besides:
            batch.append(node, "gpu_temperature_celsius", "gpu0", {}, 40.0, at)
    store.insert_metrics(batch)


def rules(tmp_path, actions, level="L2", cooldown="1h"):
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    (folder / "worn.yml").write_text(
        textwrap.dedent(f"""
        - rule_id: worn_ssd
          description: worn SSD (test)
          severity: critical
          level: {level}
          cooldown: {cooldown}
          message: "{{{{ node_id }}}} {{{{ device }}}} worn: {{{{ value | int }}}} sectors"
          trigger:
            - {{metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 5m,
               aggregate: last}}
            - {{metric: smart_media_wearout_indicator_normalized, operator: "<", threshold: 10, window: 5m,
               aggregate: last}}
        """)
        + (f"  action: {json.dumps(actions)}\n" if actions is not None else "")
    )
    return folder


def diagnose(tmp_path, dsn, rule_dir, *extra, at=AT, env=None):
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "diagnose", "--json", "--rules", str(rule_dir),
        "--at", str(at / 1000), *extra,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, cwd=TOP, env=env, check=False)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout), result


def execute_args(tmp_path, *settings):
    pairs = [f"stethoscope_diagnose_log={tmp_path / 'findings.log'}", *settings]
    return ["--execute", "--inventory", str(inventory(tmp_path)), *[x for p in pairs for x in ("-e", p)]]


def table(dsn, sql):
    with Store(dsn) as store:
        return store.query(sql.replace("DB", store.database))


@pytest.fixture
def db(tmp_dsn):
    with Store(tmp_dsn) as store:
        store.init_schema()
    return tmp_dsn


def test_dry_run_acts_on_nothing_and_writes_nothing(tmp_path, db, http_standin):
    hook = http_standin()
    with Store(db) as store:
        worn(store, "node03")
    (finding,), _ = diagnose(
        tmp_path, db, rules(tmp_path, [{"type": "alert", "message": "x", "endpoint": hook.url}])
    )
    assert finding["actions"] == ["alert"] and "txn_id" not in finding
    assert hook.requests == [] and table(db, "SELECT count() FROM DB.findings")[0][0] == 0


def test_log_alert_and_api_call_with_retries_under_one_transaction(tmp_path, db, http_standin):
    hook, switch_api = http_standin(), http_standin(fail_first=2)
    actions = [
        {"type": "log", "message": "{{ node_id }} {{ device }} worn ({{ txn_id }})"},
        {"type": "alert", "message": "{{ node_id }}: {{ value | int }} sectors"},
        {
            "type": "api_call",
            "endpoint": "{{ vars.switch_api }}/v1/port/check",
            "method": "POST",
            "payload": '{"node_id": "{{ node_id }}", "port": "{{ device }}"}',
            "retries": 3,
        },
    ]
    with Store(db) as store:
        worn(store, "node03")
    settings = execute_args(
        tmp_path, f"stethoscope_alert_webhook={hook.url}/alert", f"switch_api={switch_api.url}"
    )
    (finding,), _ = diagnose(tmp_path, db, rules(tmp_path, actions), *settings)
    txn = finding["txn_id"]
    assert finding["outcome"] == "log ok, alert ok, api_call ok"
    (alert,) = hook.requests
    assert alert.path == "/alert" and alert.headers["Idempotency-Key"] == txn
    assert alert.json()["text"] == "node03: 184 sectors" and alert.json()["finding"]["node_id"] == "node03"
    assert [r.path for r in switch_api.requests] == ["/v1/port/check"] * 3  # two 503s, then the answer
    assert {r.headers["Idempotency-Key"] for r in switch_api.requests} == {txn}
    assert switch_api.requests[-1].json() == {"node_id": "node03", "port": "sda"}
    (line,) = (tmp_path / "findings.log").read_text().splitlines()
    assert (tmp_path / "findings.log").stat().st_mode & 0o777 == 0o600  # it names nodes and faults
    assert json.loads(line)["message"] == f"node03 sda worn ({txn})"
    rows = table(
        db,
        "SELECT action, argMax(status, version), any(txn_id) FROM DB.actions GROUP BY action ORDER BY action",
    )
    assert rows == [("alert", "ok", txn), ("api_call", "ok", txn), ("log", "ok", txn)]
    assert table(db, "SELECT txn_id, status FROM DB.findings FINAL") == [(txn, "open")]


def test_a_template_error_fails_its_action_only(tmp_path, db, http_standin):
    hook = http_standin()
    actions = [  # (an endpoint naming a setting not configured is skipped: test_skipped_everywhere)
        {"type": "api_call", "endpoint": f"{hook.url}/x", "payload": '{"p": "{{ vars.not_configured }}"}'},
        {"type": "alert", "message": "still alerted", "endpoint": hook.url},
    ]
    with Store(db) as store:
        worn(store, "node03")
    (finding,), _ = diagnose(tmp_path, db, rules(tmp_path, actions), *execute_args(tmp_path))
    assert finding["outcome"] == "api_call failed, alert ok" and len(hook.requests) == 1
    (detail,) = table(
        db, "SELECT argMax(detail, version) FROM DB.actions WHERE action = 'api_call' GROUP BY txn_id"
    )
    assert "not_configured" in json.loads(detail[0])["error"]


def test_a_node_outside_the_inventory_never_reaches_a_playbook(tmp_path, db):
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.findings import diagnose as evaluate_all
    from stethoscope.diagnosis.rules import load_rules
    from stethoscope.inventory import load_inventory
    from stethoscope.remediation.executor import Context, Executor

    with Store(db) as store:
        worn(store, "node99;reboot")
    actions = [{"type": "playbook", "playbook": "remediate/drain.yml"}]
    folder = rules(tmp_path, actions)
    findings, _ = diagnose(tmp_path, db, folder, *execute_args(tmp_path))
    assert findings == []  # only the inventory's hosts are evaluated
    # and should such a finding reach the executor anyway, its name goes no further
    loaded = load_rules(folder, Catalog.load())
    with Store(db) as store:
        (finding,) = evaluate_all(store, loaded.rules, AT)
        database = store.database
    context = Context(db, database, load_inventory(tmp_path / "inventory" / "hosts.yml"))
    context.spool_dir = tmp_path / "spool"
    (acted,) = Executor(context).run([finding], loaded.rules, AT)
    assert acted["outcome"] == "playbook:remediate/drain.yml skipped"


def test_circuit_breaker_drains_one_of_eight_and_alerts_instead(tmp_path, db, http_standin, slurm):
    hook = http_standin()
    with Store(db) as store:
        for node in ("node01", "node02", "node03"):
            worn(store, node)
    actions = [{"type": "playbook", "playbook": "remediate/drain.yml"}]
    env = {**__import__("os").environ, **slurm.env}
    settings = execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    findings, _ = diagnose(tmp_path, db, rules(tmp_path, actions), *settings, env=env)
    outcomes = {f["node_id"]: f["outcome"] for f in findings}
    assert outcomes == {
        "node01": "playbook:remediate/drain.yml ok",
        "node02": "playbook:remediate/drain.yml refused",
        "node03": "playbook:remediate/drain.yml refused",
    }
    txn = {f["node_id"]: f["txn_id"] for f in findings}
    assert slurm.node("node01")["reason"].startswith(f"stethoscope: worn_ssd {txn['node01']}")
    assert "DRAIN" not in slurm.node("node02")["state"] and "DRAIN" not in slurm.node("node03")["state"]
    assert sorted(r.json()["text"].split(";")[-1].strip() for r in hook.requests) == [
        "not draining node02",
        "not draining node03",
    ]
    refused = table(
        db,
        "SELECT argMax(detail, version) FROM DB.actions GROUP BY txn_id, action, target "
        "HAVING argMax(status, version) = 'refused'",
    )
    assert all("the limit is 1 (10% of 8, at least 1)" in json.loads(d)["reason"] for (d,) in refused)


def test_a_bad_inventory_is_a_usage_error(tmp_path, db):
    command = [
        sys.executable,
        "-m",
        "stethoscope.cli",
        "--dsn",
        db,
        "diagnose",
        "--execute",
        "--inventory",
        str(tmp_path / "none.yml"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
    assert (
        result.returncode == 2
        and "none.yml: no such file" in result.stderr
        and "Traceback" not in result.stderr
    )


def test_an_action_the_store_cannot_take_is_spooled_and_replayed(tmp_path, db):
    from stethoscope.inventory import load_inventory
    from stethoscope.remediation.executor import Context, Executor
    from stethoscope.store.spool import Spool

    unreachable = Context("http://127.0.0.1:9/stethoscope", None, load_inventory(inventory(tmp_path)))
    unreachable.spool_dir = tmp_path / "spool"
    row = {
        "txn_id": "t1",
        "finding_id": "f1",
        "action": "alert",
        "target": "http://127.0.0.1/hook",
        "status": "ok",
        "detail": {"attempts": 1},
        "started_at": AT,
        "finished_at": AT + 5,
    }
    Executor(unreachable)._record(row)
    assert Spool(tmp_path / "spool").pending_rows() == 1
    with Store(db) as store:  # spooled for the server that was down: moved here on purpose
        Spool(tmp_path / "spool").replay(store, into=True)
    assert table(db, "SELECT txn_id, action, status, detail FROM DB.actions") == [
        ("t1", "alert", "ok", '{"attempts": 1}')
    ]


def other_inventory(tmp_path, first_host_vars=""):
    """A second cluster's inventory: its own hosts (none of the lab's), its settings in `all`."""
    path = tmp_path / "other" / "hosts.yml"
    (path.parent / "group_vars").mkdir(parents=True)
    (path.parent / "group_vars" / "all.yml").write_text(
        "---\nstethoscope_breaker_fraction: 0.25\nstethoscope_ticket_project: OTHER\n"
    )
    path.write_text(
        "---\nall:\n  vars:\n    ansible_connection: local\n    stethoscope_alert_webhook: http://127.0.0.1:9/all\n"
        "  children:\n    login:\n      hosts:\n"
        f"        login01: {{{first_host_vars}}}\n"
        "    gpu_nodes:\n      hosts:\n        gpu-a01-01.cluster.example: {slurm_name: a01n01}\n"
    )
    return path


def test_diagnose_with_another_inventory_never_acts_on_the_lab_nodes_in_the_same_database(tmp_path, db):
    with Store(db) as store:
        worn(store, "node03")  # a lab node, stored in the same database
    lab_run = execute_args(tmp_path)  # the lab's inventory (node01..node08): node03's finding opens
    (lab_finding,), _ = diagnose(tmp_path, db, rules(tmp_path, [{"type": "log", "message": "x"}]), *lab_run)
    assert lab_finding["node_id"] == "node03"
    with Store(db) as store:
        worn(store, "gpu-a01-01.cluster.example", at=AT + 1_000)
    other = other_inventory(tmp_path)
    log = f"stethoscope_diagnose_log={tmp_path / 'other.log'}"
    dry, _ = diagnose(tmp_path, db, tmp_path / "rules", "--inventory", str(other), at=AT + 2_000)
    assert [f["node_id"] for f in dry] == ["gpu-a01-01.cluster.example"]
    acted, _ = diagnose(
        tmp_path, db, tmp_path / "rules", "--execute", "--inventory", str(other), "-e", log, at=AT + 2_000
    )
    assert [(f["node_id"], f["outcome"]) for f in acted] == [("gpu-a01-01.cluster.example", "log ok")]
    acted_on = table(
        db,
        "SELECT DISTINCT node_id FROM DB.findings WHERE finding_id IN "
        f"(SELECT finding_id FROM DB.actions WHERE txn_id != '{lab_finding['txn_id']}')",
    )
    assert acted_on == [("gpu-a01-01.cluster.example",)]  # node03 only ever by the lab's own run
    open_ = table(
        db,
        "SELECT node_id FROM DB.findings GROUP BY finding_id, node_id "
        "HAVING argMax(status, version) = 'open' ORDER BY node_id",
    )
    assert open_ == [("gpu-a01-01.cluster.example",), ("node03",)]  # the lab's finding not resolved by it


def test_inventory_settings_come_from_the_all_group_not_the_first_host(tmp_path):
    from stethoscope.inventory import load_inventory

    path = other_inventory(tmp_path, "stethoscope_breaker_fraction: 0.9, stethoscope_only_here: 1")
    loaded = load_inventory(path)
    assert next(iter(loaded.hosts)) == "login01"  # the host with its own stethoscope_ vars is read first
    assert loaded.settings == {
        "stethoscope_alert_webhook": "http://127.0.0.1:9/all",
        "stethoscope_breaker_fraction": 0.25,
        "stethoscope_ticket_project": "OTHER",
    }
    assert loaded.hosts["gpu-a01-01.cluster.example"].slurm_name == "a01n01"  # host vars still per host
