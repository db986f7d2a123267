"""Incidents: the findings of one failure on one node and enclosing device share one transaction (one
evidence bundle, one ticket, one drain), whatever rules see it; a later, more severe finding
escalates it without a second ticket; a finding long after the incident's last match opens its own."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest
from test_execute import db, diagnose, execute_args, others_report, table

from stethoscope.catalog import Catalog
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, replay_sweeps

__all__ = ["db"]  # the fixture, shared with test_execute
T0 = now_ms() - 3 * 3600_000
MINUTE = 60_000
DRAIN = "playbook:remediate/drain.yml"
EVIDENCE, TICKET = "playbook:remediate/evidence.yml", "playbook:remediate/ticket.yml"


def shipped_rules(tmp_path, *files):
    """The knowledge base's own rule files (rules/), copied: what the lab's findings come from."""
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    for name in files:
        shutil.copy(TOP / "rules" / name, folder / name.replace("/", "_"))
    return folder


def ticketing(tmp_path, slurm, jira):
    env = {
        **os.environ,
        **slurm.env,
        "STETHOSCOPE_TICKET_USER": "stethoscope-bot",
        "STETHOSCOPE_TICKET_TOKEN": "t0ken",
    }
    settings = execute_args(
        tmp_path,
        f"stethoscope_ticket_url={jira.url}",
        f"stethoscope_evidence_dir={tmp_path / 'evidence'}",
    )
    modules_in_this_python(tmp_path)
    return env, settings


def modules_in_this_python(tmp_path):
    """The test inventory's modules run by this Python (with Ansible's libraries), as on the lab."""
    hosts = tmp_path / "inventory" / "hosts.yml"
    python = "    ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
    hosts.write_text(hosts.read_text().replace("  vars:\n", "  vars:\n" + python, 1))


def created(jira):
    return [r for r in jira.requests if r.method == "POST" and r.path == "/rest/api/2/issue"]


@pytest.mark.parametrize(
    ("device", "enclosing"),
    [
        ("gpu2/link3", "gpu2"),
        ("gpu2", "gpu2"),
        ("mlx5_0/1", "mlx5_0"),
        ("mlx5_1", "mlx5_1"),
        ("nvme0n1", "nvme0n1"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("", ""),
    ],
)
def test_a_device_belongs_to_the_device_the_catalog_encloses_it_in(device, enclosing):
    from stethoscope.remediation.incidents import enclosing_device

    assert enclosing_device(Catalog.load(), device) == enclosing


def test_the_labs_one_ecc_event_and_one_bad_ib_link_are_one_incident_each(
    tmp_path, db, lab_sweeps, slurm, http_standin
):
    jira = http_standin()
    with Store(db) as store:
        replay_sweeps(store, lab_sweeps, [T0 - 2 * MINUTE, T0 - MINUTE, T0])
    rule_dir = shipped_rules(
        tmp_path, "gpu/ecc.yml", "gpu/xid.yml", "gpu/row_remap.yml", "network/ib_port.yml", "network/rdma.yml"
    )
    env, settings = ticketing(tmp_path, slurm, jira)
    findings, _ = diagnose(tmp_path, db, rule_dir, *settings, "--no-model", at=T0, env=env)
    txns = {(f["node_id"], f["device"], f["rule_id"]): f["txn_id"] for f in findings}
    gpu = {r: t for (n, d, r), t in txns.items() if (n, d) == ("node04", "gpu0")}
    assert {"gpu_volatile_dbe", "gpu_xid_48", "gpu_xid_63", "gpu_row_remap_pending"} <= set(gpu)
    (incident,) = set(gpu.values())  # one transaction for node04's one double-bit ECC event
    bad_link = {r: t for (n, d, r), t in txns.items() if n == "node08" and d.startswith("mlx5_1")}
    assert {"ib_symbol_errors", "rdma_qp_in_error"} <= set(bad_link) and len(set(bad_link.values())) == 1
    port_down = {t for (n, d, _), t in txns.items() if (n, d) == ("node08", "mlx5_0/1")}
    assert len(port_down) == 1 and port_down.isdisjoint(bad_link.values())  # another HCA: its own

    by_rule = {f["rule_id"]: f for f in findings if f["txn_id"] == incident}
    assert by_rule["gpu_xid_48"]["outcome"] == (  # the worst of those new at once opens the incident
        f"log ok, alert skipped, {DRAIN} ok, {EVIDENCE} ok, {TICKET} ok"
    )  # (no webhook configured: the alert is skipped)
    assert by_rule["gpu_volatile_dbe"]["outcome"] == f"joined incident {incident} (same device gpu0): log ok"
    assert slurm.node("node04")["reason"].startswith(f"stethoscope: gpu_xid_48 {incident}")
    drains = table(db, f"SELECT txn_id FROM DB.actions FINAL WHERE action = '{DRAIN}'")
    assert drains == [(incident,)]
    assert sorted(p.name for p in (tmp_path / "evidence" / incident).glob("*.tar.gz")) == ["node04.tar.gz"]
    incidents = {t for t in txns.values() if t in {incident, *bad_link.values(), *port_down}}
    assert sorted(p.name for p in (tmp_path / "evidence").iterdir()) == sorted(incidents)
    issues = [i for i in jira.issues.values() if f"stethoscope-{incident}" in i["labels"]]
    assert len(issues) == 1 and len(created(jira)) == len(jira.issues) == 3  # one per incident


ROW_REMAPS = "gpu_remapped_rows_uncorrectable"


def gpu_rows(store, node, at, **metrics):
    """Rows as gpu_facts writes them, for one GPU of `node`; the rest of the inventory reports too."""
    batch = MetricColumns()
    for metric, (device, labels, value) in metrics.items():
        batch.append(node, metric, device, labels, value, at)
    store.insert_metrics(batch)
    others_report(store, at, besides=node)


def test_a_more_severe_finding_joining_later_escalates_without_a_second_ticket(
    tmp_path, db, slurm, http_standin
):
    jira = http_standin()
    rule_dir = shipped_rules(tmp_path, "gpu/ecc.yml", "gpu/xid.yml", "gpu/row_remap.yml")
    env, settings = ticketing(tmp_path, slurm, jira)
    with Store(db) as store:  # 600 rows remapped for uncorrectable errors: warning, evidence and ticket
        gpu_rows(store, "node05", T0, **{ROW_REMAPS: ("gpu2", {}, 600.0)})
    (first,), _ = diagnose(tmp_path, db, rule_dir, *settings, at=T0, env=env)
    assert first["rule_id"] == "gpu_uncorrectable_row_remaps" and len(jira.issues) == 1
    txn = first["txn_id"]
    at = T0 + 10 * MINUTE
    with Store(db) as store:  # then a double-bit ECC error on the same GPU: DBE count and XID 48
        gpu_rows(
            store,
            "node05",
            at,
            **{
                ROW_REMAPS: ("gpu2", {}, 600.0),
                "gpu_ecc_uncorrected_volatile_total": ("gpu2", {}, 1.0),
                "gpu_xid_errors_total": ("gpu2", {"xid": "48"}, 1.0),
            },
        )
    findings, _ = diagnose(tmp_path, db, rule_dir, *settings, at=at, env=env)
    by_rule = {f["rule_id"]: f for f in findings}
    assert {f["txn_id"] for f in findings} == {txn}
    assert by_rule["gpu_xid_48"]["outcome"] == (
        f"escalated warning -> critical under txn {txn}, log ok, {DRAIN} ok, {TICKET} ok"
    )
    assert by_rule["gpu_volatile_dbe"]["outcome"] == f"joined incident {txn} (same device gpu2): log ok"
    assert "no new action" in by_rule["gpu_uncorrectable_row_remaps"]["outcome"]
    (issue,) = jira.issues.values()  # one ticket, updated with a comment
    assert f"stethoscope-{txn}" in issue["labels"] and len(created(jira)) == 1
    assert [r.path for r in jira.requests if r.path.endswith("/comment")] == [
        "/rest/api/2/issue/OPS-1/comment"
    ]
    assert slurm.node("node05")["reason"].startswith(f"stethoscope: gpu_xid_48 {txn}")
    evidence = table(
        db, "SELECT count() FROM DB.actions FINAL WHERE action = 'playbook:remediate/evidence.yml'"
    )
    assert evidence == [(1,)]
    escalation = table(db, "SELECT detail FROM DB.actions FINAL WHERE action = 'escalate'")
    assert json.loads(escalation[0][0])["runs"] == ["log", DRAIN, TICKET]


LOGGED = """
- rule_id: gpu_hot
  description: hot GPU (test)
  severity: warning
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m, aggregate: last}
  action: [{type: log, message: hot}, {type: alert, message: hot}]
- rule_id: gpu_dbe
  description: double-bit ECC (test)
  severity: critical
  trigger:
    - {metric: gpu_ecc_uncorrected_volatile_total, operator: ">", threshold: 0, window: 5m, aggregate: last}
  action: [{type: log, message: dbe}, {type: alert, message: dbe}]
- rule_id: cpu_powersave
  description: CPUs off the performance governor (test)
  severity: warning
  trigger:
    - {metric: cpu_governor_performance, operator: "==", threshold: 0, window: 5m, aggregate: last}
  action: [{type: log, message: governor}, {type: alert, message: governor}]
"""


def test_a_node_level_finding_joins_the_nodes_incident_one_beyond_the_window_or_on_another_gpu_does_not(
    tmp_path, db, http_standin
):
    hook = http_standin()
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "gpu.yml").write_text(textwrap.dedent(LOGGED))
    settings = execute_args(
        tmp_path, f"stethoscope_alert_webhook={hook.url}", "stethoscope_incident_window=30m"
    )
    with Store(db) as store:
        batch = MetricColumns()
        batch.append("node05", "gpu_temperature_celsius", "gpu1", {}, 90.0, T0)
        batch.append("node05", "cpu_governor_performance", "", {}, 0.0, T0)  # tuning_facts: the node's
        store.insert_metrics(batch)
        gpu_rows(store, "node05", T0, gpu_ecc_uncorrected_volatile_total=("gpu2", {}, 1.0))
    findings, _ = diagnose(tmp_path, db, folder, *settings, at=T0)
    assert len({f["txn_id"] for f in findings}) == 2  # gpu1 and gpu2: two incidents
    by_rule = {f["rule_id"]: f for f in findings}
    worst = by_rule["gpu_dbe"]["txn_id"]  # the node-level finding joins the node's worst open incident
    assert by_rule["cpu_powersave"]["txn_id"] == worst
    assert by_rule["cpu_powersave"]["outcome"] == f"joined incident {worst} (same node): log ok"
    hot = next(f for f in findings if f["rule_id"] == "gpu_hot")
    later = T0 + 45 * MINUTE  # gpu1 said nothing since T0: its incident is stale, out of the window
    with Store(db) as store:
        gpu_rows(store, "node05", later, gpu_ecc_uncorrected_volatile_total=("gpu1", {}, 1.0))
    findings, _ = diagnose(tmp_path, db, folder, *settings, at=later)
    dbe = next(f for f in findings if (f["rule_id"], f["device"]) == ("gpu_dbe", "gpu1"))
    assert dbe["txn_id"] != hot["txn_id"] and dbe["outcome"] == "log ok, alert ok"
