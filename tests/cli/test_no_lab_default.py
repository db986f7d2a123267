"""No lab outside the lab: nothing acts without an inventory it was given, ansible.cfg names none, and a
store that holds nothing of the inventory's nodes (empty, or pointed elsewhere) is UNKNOWN (exit 1),
never "healthy"."""

from __future__ import annotations

import configparser
import json

import pytest
from test_cli import cli
from test_execute import inventory

from stethoscope.store.client import Store

from conftest import TOP, hot_gpu


def test_ansible_cfg_names_no_inventory():
    config = configparser.ConfigParser()
    config.read(TOP / "ansible.cfg")
    assert "inventory" not in config["defaults"]


@pytest.mark.parametrize("command", [["diagnose"], ["watch", "--cycles", "1", "--interval", "0"]])
def test_execute_without_an_inventory_is_a_usage_error_and_acts_on_nothing(tmp_path, tmp_dsn, command):
    hot_gpu(tmp_dsn)  # node01, a lab name, is hot: the lab must not be acted on by default
    log = tmp_path / "findings.log"
    run = cli("--dsn", tmp_dsn, *command, "--execute", "--no-model", "-e", f"stethoscope_diagnose_log={log}")
    assert run.returncode == 2, run.stderr
    assert "--execute needs an inventory: --inventory INV or STETHOSCOPE_INVENTORY" in run.stderr
    assert "Traceback" not in run.stderr and not log.exists()
    with Store(tmp_dsn) as store:
        assert store.query(f"SELECT count() FROM {store.database}.findings") == [(0,)]


def test_serve_and_collector_without_an_inventory_are_usage_errors(tmp_dsn):
    for command in (["serve", "--no-sweep"], ["collector", "--duration", "0"]):
        run = cli("--dsn", tmp_dsn, *command)
        assert run.returncode == 2 and "needs an inventory" in run.stderr, run.stderr


def test_a_store_with_nothing_of_the_inventorys_nodes_is_unknown_never_healthy(tmp_path, tmp_dsn):
    with Store(tmp_dsn) as store:  # an empty database: the DSN points at the wrong place
        store.init_schema()
    hosts = inventory(tmp_path)
    run = cli("--dsn", tmp_dsn, "diagnose", "--no-model", "--json", "--inventory", str(hosts))
    assert run.returncode == 1, run.stderr  # critical: not healthy, not a crash
    (finding,) = json.loads(run.stdout)
    assert (finding["rule_id"], finding["severity"]) == ("unknown.fleet", "critical")
    assert "no data from any of the 8 nodes of the inventory" in finding["message"]
    assert "database stethoscope of chdb://" in finding["message"]
    hot_gpu(tmp_dsn, "elsewhere-01")  # data, but of another cluster's node
    other = cli("--dsn", tmp_dsn, "diagnose", "--no-model", "--json", "--inventory", str(hosts))
    assert other.returncode == 1 and "unknown.fleet" in other.stdout


def test_a_store_with_no_data_at_all_is_unknown_without_an_inventory_too(tmp_dsn):
    with Store(tmp_dsn) as store:
        store.init_schema()
    run = cli("--dsn", tmp_dsn, "diagnose", "--no-model")
    assert run.returncode == 1, run.stderr
    assert "UNKNOWN fleet: no data from any node in database stethoscope" in run.stdout
    assert "healthy" not in run.stdout


def test_summary_reads_an_empty_store_as_diagnose_does(tmp_path, tmp_dsn):
    """Regression guard (a fresh-clone trial): `summary` said "no metric rows stored yet" where
    `diagnose` gave a critical UNKNOWN fleet: one reading of "unhealthy", not two."""
    with Store(tmp_dsn) as store:
        store.init_schema()
    hosts = inventory(tmp_path)
    run = cli("--dsn", tmp_dsn, "summary", "--no-model", "--inventory", str(hosts))
    assert run.returncode == 0, run.stderr
    assert "unknown.fleet (critical): UNKNOWN fleet: no data from any of the 8 nodes" in run.stdout
    assert all(f"node0{n}" in run.stdout for n in range(1, 9))  # every host, none of which reported
