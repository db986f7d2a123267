"""What a playbook stethoscope runs through ansible-runner is told: the database and the spool of the
process that runs it, no wait for an embedded database that process may hold (serve's, for its whole
life), and the user's own ansible.cfg and collections beside the shipped collection."""

from __future__ import annotations

import os

from test_execute import inventory, rules, worn

from stethoscope.paths import collections_path
from stethoscope.remediation.actions.playbook import (
    HostTally,
    ansible_environment,
    outlived_output,
    playbook_environment,
    run_playbook,
)
from stethoscope.store.client import Store
from stethoscope.store.spool import Spool
from stethoscope.timeutil import now_ms

EVIDENCE = "playbook:remediate/evidence.yml"


def test_a_remediation_playbook_spools_into_the_executors_spool_at_once_while_serve_holds_the_database(
    tmp_path, monkeypatch
):
    """Regression: remediation playbooks got only the DSN and database: under `serve --execute` their
    callback waited for the embedded database serve holds, then spooled into a folder serve never
    replays (`--spool-dir`)."""
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.findings import diagnose as evaluate_all
    from stethoscope.diagnosis.rules import load_rules
    from stethoscope.inventory import load_inventory
    from stethoscope.remediation.executor import Context, Executor

    at = now_ms() - 5_000
    dsn, served = f"chdb://{tmp_path / 'db'}", tmp_path / "serve-spool"
    elsewhere = tmp_path / "default-spool"  # where a playbook's callback spools unless told otherwise
    monkeypatch.setenv("STETHOSCOPE_SPOOL_DIR", str(elsewhere))
    monkeypatch.delenv("STETHOSCOPE_OPEN_WAIT", raising=False)
    hosts = inventory(tmp_path)  # node03 cannot be reached: the callback has a row to write about it
    hosts.write_text(
        hosts.read_text().replace(
            "node03: {", "node03: {ansible_connection: ssh, ansible_host: 127.0.0.1, ansible_port: 9, "
        )
    )
    folder = rules(tmp_path, [{"type": "playbook", "playbook": "remediate/evidence.yml"}])
    loaded = load_rules(folder, Catalog.load())
    with Store(dsn) as store:  # held by this process, as serve holds it, while the playbook runs
        store.init_schema()
        worn(store, "node03", at=at)
        (finding,) = evaluate_all(store, loaded.rules, at)
        context = Context(dsn, None, load_inventory(hosts), spool_dir=served)
        (acted,) = Executor(context).run([finding], loaded.rules, at)
    assert acted["outcome"] == f"{EVIDENCE} failed"  # unreachable
    spooled = "".join(path.read_text() for path in Spool(served).pending())  # here, not elsewhere
    assert '"ansible_host_unreachable"' in spooled and '"node03"' in spooled, acted
    assert not elsewhere.exists() or Spool(elsewhere).pending_rows() == 0


def test_playbook_environment_names_the_database_the_spool_and_no_wait_for_an_embedded_one(tmp_path):
    embedded = playbook_environment(f"chdb://{tmp_path / 'db'}", "stethoscope", tmp_path / "spool")
    assert embedded == {
        "STETHOSCOPE_DSN": f"chdb://{tmp_path / 'db'}",
        "STETHOSCOPE_DATABASE": "stethoscope",
        "STETHOSCOPE_SPOOL_DIR": str(tmp_path / "spool"),
        "STETHOSCOPE_OPEN_WAIT": "0",
        "STETHOSCOPE_WRITE_TIMEOUT": "2",
    }
    server = playbook_environment("http://u:p@ch:8123/stethoscope", None, tmp_path / "spool")
    assert server == {
        "STETHOSCOPE_DSN": "http://u:p@ch:8123/stethoscope",
        "STETHOSCOPE_SPOOL_DIR": str(tmp_path / "spool"),
    }


def test_a_playbook_run_reads_the_users_ansible_cfg_and_keeps_their_collections(tmp_path, monkeypatch):
    """Regression: ANSIBLE_CONFIG was always the shipped (or checkout) ansible.cfg: the one README tells
    users to export (/etc/stethoscope/ansible.cfg: SSH, become, forks) never reached a sweep or a
    drain, and a user's ANSIBLE_COLLECTIONS_PATH was replaced by the shipped one."""
    user_tmp = tmp_path / "their-local-tmp"
    config = tmp_path / "etc" / "ansible.cfg"
    config.parent.mkdir()
    config.write_text(f"[defaults]\ninject_facts_as_vars = false\nforks = 4\nlocal_tmp = {user_tmp}\n")
    theirs = tmp_path / "their-collections"
    monkeypatch.setenv("ANSIBLE_CONFIG", str(config))
    monkeypatch.setenv("ANSIBLE_COLLECTIONS_PATH", str(theirs))
    monkeypatch.delenv("ANSIBLE_LOCAL_TEMP", raising=False)
    monkeypatch.delenv("ANSIBLE_CALLBACKS_ENABLED", raising=False)
    assert ansible_environment() == {
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join([str(collections_path()), str(theirs)]),
        "ANSIBLE_CALLBACKS_ENABLED": "aicluster.stethoscope.clickhouse",  # the run is still stored
    }
    extravars = {"stethoscope_txn_id": "t1", "stethoscope_rule_id": "worn_ssd", "stethoscope_finding": {}}
    result = run_playbook("remediate/ticket.yml", inventory(tmp_path), "node03", extravars, {}, 300)
    assert result.ok and "stethoscope_ticket_url" in result.skipped, result  # the shipped role ran
    assert user_tmp.is_dir()  # Ansible made its local temp folder where their ansible.cfg says


def test_the_collections_and_callbacks_of_the_users_ansible_cfg_are_kept_beside_the_shipped_ones(
    tmp_path, monkeypatch
):
    config = tmp_path / "etc" / "ansible.cfg"
    config.parent.mkdir()
    config.write_text(
        "[defaults]\ncollections_path = ./collections:/opt/site/collections\n"
        "callbacks_enabled = ansible.posix.profile_tasks\n"
    )
    monkeypatch.setenv(
        "ANSIBLE_CONFIG", str(config.parent)
    )  # a folder holding ansible.cfg, as Ansible reads it
    monkeypatch.delenv("ANSIBLE_COLLECTIONS_PATH", raising=False)
    monkeypatch.delenv("ANSIBLE_CALLBACKS_ENABLED", raising=False)
    env = ansible_environment()
    assert env["ANSIBLE_CONFIG"] == str(config.parent)
    assert env["ANSIBLE_COLLECTIONS_PATH"].split(os.pathsep) == [
        str(collections_path()),
        str(tmp_path / "etc" / "collections"),
        "/opt/site/collections",
    ]
    assert env["ANSIBLE_CALLBACKS_ENABLED"] == "ansible.posix.profile_tasks,aicluster.stethoscope.clickhouse"
    monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "missing.cfg"))  # none there: the shipped one
    assert ansible_environment()["ANSIBLE_COLLECTIONS_PATH"] == str(collections_path())


def test_a_run_whose_output_outlived_ansible_playbook_is_judged_by_its_hosts_task_results():
    """ansible-runner waits 5 s for its terminal's end once ansible-playbook has exited and raises
    pexpect's TIMEOUT past that, with the run's last event, the stats, never handed on: serve's sweeps
    ended in `TIMEOUT: <pexpect.pty_spawn.spawn object ...>` and counted failed though every host had
    answered (seen twice in nine sweeps of a loaded 64-node lab). The run is over: its hosts' task
    results, tallied as they came, say how it went. (Which read pexpect makes last, after the exit, is
    a race in the kernel's terminal buffering: a test cannot make it happen on demand.)"""
    tally = HostTally()
    for event, host, extra in [
        ("runner_on_ok", "node01", {}),
        ("runner_on_ok", "node02", {}),
        ("runner_on_failed", "node02", {"ignore_errors": True}),  # ignored: no failure in the stats
        ("runner_on_skipped", "node03", {}),
    ]:
        tally.count({"event": event, "event_data": {"host": host, "task": "Sweep", **extra}})
    answered = outlived_output([], tally.stats())
    assert answered.ok and answered.rc is None and answered.stats["ok"] == {"node01": 1, "node02": 1}
    assert "its output went on after ansible-playbook exited" in answered.status
    assert "judged by its hosts' task results (successful)" in answered.status
    tally.count({"event": "runner_on_unreachable", "event_data": {"host": "node04", "task": "Sweep"}})
    lost = outlived_output([], tally.stats())
    assert not lost.ok and lost.stats["dark"] == {"node04": 1} and "(failed)" in lost.status
    nothing = outlived_output([], HostTally().stats())
    assert not nothing.ok and "no host's result came" in nothing.status
