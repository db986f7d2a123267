"""metrics_hourly (docs/design.md "Storage"): per series and whole hour the min, the max with its time, the
average, the last value and the count, fed by the raw rows as they are written and, on `db init` of a
database from before it, backfilled from them; max, its time and last equal what the raw rows say."""

from __future__ import annotations

import json
import subprocess
import sys

from stethoscope.catalog import Catalog
from stethoscope.report.top import Window, top
from stethoscope.store.batch import MetricColumns
from stethoscope.store.result_rows import rows_from_result
from stethoscope.store.writer import Writer
from stethoscope.timeutil import now_ms

HOUR = 3_600_000
T0 = now_ms() - now_ms() % HOUR - 5 * HOUR  # a whole hour, inside the raw TTL


def hourly(store, node: str) -> list[tuple]:
    return store.query(
        "SELECT metric_name, device, hour, min(min_value), max(max_value), "
        "toUnixTimestamp64Milli(argMaxMerge(max_at)), argMaxMerge(last_value), sum(samples), "
        "toUnixTimestamp64Milli(min(first_at)), toUnixTimestamp64Milli(max(last_at)) "
        f"FROM {store.database}.metrics_hourly WHERE node_id = {{node:String}} "
        "GROUP BY node_id, metric_name, device, labels_key, hour ORDER BY metric_name, device, hour",
        {"node": node},
    )


def raw(store, node: str) -> list[tuple]:
    """The same figures computed from the raw rows, each stored row once."""
    return store.query(
        "SELECT metric_name, device, toStartOfHour(timestamp) AS hour, min(value), max(value), "
        "toUnixTimestamp64Milli(argMax(timestamp, (value, -toUnixTimestamp64Milli(timestamp)))), "
        "argMax(value, timestamp), count(), toUnixTimestamp64Milli(min(timestamp)), "
        f"toUnixTimestamp64Milli(max(timestamp)) FROM {store.database}.metrics FINAL "
        "WHERE node_id = {node:String} GROUP BY metric_name, device, labels_key, hour "
        "ORDER BY metric_name, device, hour",
        {"node": node},
    )


def sweep(node: str, temperature: float, reallocated: float) -> dict:
    """A task result as the collectors return it (what the callback turns into rows)."""
    return {
        "stethoscope_metrics": [
            {"name": "gpu_temperature_celsius", "device": "gpu0", "value": temperature, "labels": {}},
            {"name": "smart_reallocated_sector_ct", "device": "sda", "value": reallocated, "labels": {}},
        ]
    }


def test_hourly_rows_come_from_the_writer_the_callback_uses(store, tmp_path):
    writer = Writer(store.dsn, tmp_path / "spool")
    store.close()  # the writer opens the embedded path itself, as the callback does
    readings = [(61, 4), (75, 4), (75, 5), (58, 5)]  # two equal maxima: its time is the first one's
    for minute, (temperature, reallocated) in enumerate(readings):
        batch = rows_from_result("n1", sweep("n1", temperature, reallocated), "run", T0 + minute * 60_000)
        assert writer.write(batch).stored == 2
    store.open()
    rows = hourly(store, "n1")
    assert rows == raw(store, "n1")
    by_metric = {row[0]: row for row in rows}
    assert by_metric["gpu_temperature_celsius"][3:8] == (58, 75, T0 + 60_000, 58, 4)
    assert by_metric["smart_reallocated_sector_ct"][4:8] == (5, T0 + 2 * 60_000, 5, 4)


def test_hourly_rollup_is_backfilled_when_db_init_meets_a_database_from_before_it(store):
    batch = MetricColumns()
    for i in range(150):  # 150 minutes: three hours, the last two partial
        value, at = 50 + (i * 37) % 23, T0 + 20 * 60_000 + i * 60_000
        batch.append("n1", "gpu_temperature_celsius", "gpu0", {}, value, at)
        batch.append("n1", "gpu_xid_errors_total", "gpu0", {"xid": "79"}, 3 + i // 100, T0 + i * 60_000)
    store.insert_metrics(batch)
    store.insert_metrics(batch)  # a replay: the raw table folds it, and so must the backfill
    expected = raw(store, "n1")
    # a database made before the rollup existed
    store.command(f"DROP TABLE {store.database}.metrics_hourly_mv")
    store.command(f"DROP TABLE {store.database}.metrics_hourly")
    assert any(s.startswith(f"INSERT INTO {store.database}.metrics_hourly") for s in store.init_schema())
    assert hourly(store, "n1") == expected
    assert len(expected) == 6
    assert not any(s.startswith("INSERT") for s in store.init_schema())  # it exists now: no second backfill
    assert hourly(store, "n1") == expected


def test_cluster_ddl_has_the_hourly_rollup_and_clickhouse_parses_it(store):
    statements = store.check_cluster_ddl("gpu_cluster")
    hourly_statements = [s for s in statements if "metrics_hourly" in s]
    assert any("ReplicatedAggregatingMergeTree('/clickhouse/tables/{shard}/" in s for s in hourly_statements)
    assert any("TO " + store.database + ".metrics_hourly_local" in s for s in hourly_statements)


def test_labels_in_another_order_are_one_series_in_both_rollups(store):
    """The rollups group by the labels map beside its canonical key (cheaper than aggregating the map):
    the same labels in another order are still one series, counted once per row."""
    batch = MetricColumns()
    batch.append("n1", "ib_port_rcv_errors_total", "mlx5_0", {"port": "1", "lid": "7"}, 3, T0 + 60_000)
    batch.append("n1", "ib_port_rcv_errors_total", "mlx5_0", {"lid": "7", "port": "1"}, 5, T0 + 120_000)
    store.insert_metrics(batch)
    # two rollup rows of one key until a merge: what every reader folds
    assert store.query(f"SELECT count() FROM {store.database}.metrics_hourly WHERE node_id = 'n1'") == [(2,)]
    assert [row[3:8] for row in hourly(store, "n1")] == [(3, 5, T0 + 120_000, 5, 2)]
    window = Window(T0, T0 + HOUR)  # one whole hour: `top` reads it from metrics_hourly
    from_rollup = top(store, Catalog.load(), "ib_port_rcv_errors_total", window)
    assert from_rollup == top(store, Catalog.load(), "ib_port_rcv_errors_total", window, via="raw")
    assert [(entry.node_id, entry.value) for entry in from_rollup] == [("n1", 2)]
    daily = store.query(
        f"SELECT labels_key, sum(samples), argMaxMerge(last_value) FROM {store.database}.metrics_daily "
        "WHERE node_id = 'n1' GROUP BY node_id, metric_name, device, labels_key, day"
    )
    assert [row[1:] for row in daily] == [(2, 5)]


# the views' queries as databases made before 2026-12-07 hold them (stethoscope/store/schema.py then)
OLDER_VIEW_SELECTS = {
    "metrics_daily_mv": "SELECT node_id, metric_name, device, any(labels) AS labels, labels_key, "
    "toDate(timestamp) AS day, min(value) AS min_value, max(value) AS max_value, "
    "avgState(value) AS avg_value, "
    "argMaxState(value, timestamp) AS last_value, count() AS samples FROM {db}.metrics "
    "GROUP BY node_id, metric_name, device, labels_key, day",
    "metrics_hourly_mv": "SELECT node_id, metric_name, device, any(labels) AS labels, labels_key, "
    "toStartOfHour(timestamp) AS hour, min(value) AS min_value, max(value) AS max_value, "
    "argMaxState(timestamp, (value, -toUnixTimestamp64Milli(timestamp))) AS max_at, "
    "avgState(value) AS avg_value, argMaxState(value, timestamp) AS last_value, "
    "min(timestamp) AS first_at, max(timestamp) AS last_at, count() AS samples FROM {db}.metrics "
    "GROUP BY node_id, metric_name, device, labels_key, hour",
}


def view_selects(store) -> dict[str, str]:
    rows = store.query(
        "SELECT name, as_select FROM system.tables "
        "WHERE database = {db:String} AND engine = 'MaterializedView'",
        {"db": store.database},
    )
    return dict(rows)


def older_views(store) -> None:
    for name, older in OLDER_VIEW_SELECTS.items():
        store.command(f"ALTER TABLE {store.database}.{name} MODIFY QUERY {older.format(db=store.database)}")
    assert all("any(labels)" in select for select in view_selects(store).values())


def test_a_writer_process_brings_the_rollup_views_of_an_older_database_to_the_current_query(store, tmp_path):
    """A database made before the rollups grouped by the labels map aggregates it with any(): the same
    results at twice the insert's cost. The first write of a process that opens it (ensure_schema:
    here `stethoscope ingest`) changes each view's query in place (no insert goes uncounted)."""
    older_views(store)
    row = {"node_id": "n1", "metric_name": "gpu_temperature_celsius", "device": "gpu0", "labels": {}}
    (tmp_path / "rows.ndjson").write_text(json.dumps({**row, "value": 61, "timestamp": T0 // 1000}) + "\n")
    store.close()
    ingest = [
        sys.executable,
        "-m",
        "stethoscope.cli",
        "--dsn",
        store.dsn,
        "--spool-dir",
        str(tmp_path / "spool"),
    ]
    result = subprocess.run(
        [*ingest, "ingest", str(tmp_path / "rows.ndjson")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    store.open()
    upgraded = view_selects(store)
    assert set(upgraded) == set(OLDER_VIEW_SELECTS)
    assert not any("any(labels)" in select for select in upgraded.values())
    assert hourly(store, "n1") == raw(store, "n1") and len(raw(store, "n1")) == 1


def test_db_init_brings_older_views_to_the_current_query_and_makes_a_missing_one(store):
    older_views(store)
    store.command(f"DROP TABLE {store.database}.metrics_daily_mv")
    statements = store.init_schema()
    assert [s.split(" MODIFY QUERY")[0] for s in statements if "MODIFY QUERY" in s] == [
        f"ALTER TABLE {store.database}.metrics_hourly_mv"
    ]
    upgraded = view_selects(store)
    assert set(upgraded) == set(OLDER_VIEW_SELECTS)
    assert not any("any(labels)" in select for select in upgraded.values())
    assert not any("MODIFY QUERY" in s for s in store.init_schema())  # current now: nothing to change


def test_db_init_says_which_views_it_brought_to_the_current_query(store):
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", store.dsn, "db", "init"]
    views = [f"{store.database}.metrics_daily_mv", f"{store.database}.metrics_hourly_mv"]
    older_views(store)
    store.close()
    said = subprocess.run(command, capture_output=True, text=True)
    assert said.returncode == 0, said.stderr
    assert f"rollup views given the current query: {', '.join(views)}" in said.stdout
    again = subprocess.run([*command, "--json"], capture_output=True, text=True)
    assert again.returncode == 0 and json.loads(again.stdout)["views_upgraded"] == []  # current now
    store.open()
    older_views(store)
    store.close()
    said = subprocess.run([*command, "--json"], capture_output=True, text=True)
    assert sorted(json.loads(said.stdout)["views_upgraded"]) == views
    store.open()
