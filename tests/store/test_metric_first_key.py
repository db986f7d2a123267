"""The raw table and its rollups are sorted metric first: a rule reads one metric on every node, and with
node_id first ClickHouse's primary-key search, at each query's planning, walked every mark of the day's
parts (16 ms a read at 200 nodes x 24 h, 125 ms at 2,000; a cycle makes about 80,
benchmarks/diagnosis_cycle.py); metric first, the metric's rows are one range of each part. A database
created before keeps its keys (ClickHouse cannot reorder one in place): `db init` says so."""

from __future__ import annotations

import json
import subprocess
import sys

from stethoscope.store.batch import MetricColumns
from stethoscope.store.schema import single_node_ddl

AT = 1_796_000_000_000
METRIC_FIRST = ("metrics", "metrics_daily", "metrics_hourly")


def sorting_keys(store) -> dict[str, str]:
    rows = store.query(
        "SELECT name, sorting_key FROM system.tables WHERE database = {db:String}", {"db": store.database}
    )
    return dict(rows)


def some_rows(store) -> None:
    batch = MetricColumns()
    for node in ("node01", "node02", "node03"):
        for metric in ("gpu_temperature_celsius", "ib_link_downed_total"):
            batch.append(node, metric, "gpu0", {}, 1.0, AT)
    store.insert_metrics(batch)


def test_the_raw_table_and_its_rollups_are_sorted_metric_first_the_fault_windows_node_first(store):
    keys = sorting_keys(store)
    assert all(keys[name].startswith("metric_name, node_id, device, labels_key") for name in METRIC_FIRST)
    assert keys["fault_windows"].startswith("node_id, metric_name")  # read a node at a time


def test_a_resent_row_collapses_and_rows_of_other_nodes_do_not_whatever_the_key_order(store):
    some_rows(store)
    some_rows(store)  # sent again: one row each, in a FINAL read
    rows = store.query(f"SELECT node_id, metric_name FROM {store.database}.metrics FINAL")
    assert len(rows) == 6 and len(set(rows)) == 6


def node_first_database(dsn: str) -> None:
    """The schema as `db init` created it before the rollups and the raw table were sorted metric first."""
    from stethoscope.store.client import Store

    with Store(dsn) as store:
        for statement in single_node_ddl(store.database):
            store.command(
                statement.replace("ORDER BY (metric_name, node_id,", "ORDER BY (node_id, metric_name,")
            )


def test_db_init_keeps_a_node_first_database_and_says_which_tables_read_at_the_old_cost(tmp_dsn):
    node_first_database(tmp_dsn)
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "db", "init"]
    said = subprocess.run(command, capture_output=True, text=True)
    assert said.returncode == 0, said.stderr
    tables = "stethoscope.metrics, stethoscope.metrics_daily, stethoscope.metrics_hourly"
    assert f"sorted node first, as created before 2026-12-07: {tables}" in said.stdout
    again = subprocess.run([*command, "--json"], capture_output=True, text=True)
    assert json.loads(again.stdout)["sorted_node_first"] == tables.split(", ")  # kept: never rebuilt


def test_db_init_on_a_new_database_says_nothing_of_node_first_tables(tmp_dsn):
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "db", "init"]
    said = subprocess.run([*command, "--json"], capture_output=True, text=True)
    assert said.returncode == 0 and json.loads(said.stdout)["sorted_node_first"] == []
