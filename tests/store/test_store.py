"""The store against real embedded ClickHouse (chdb through clickhouse-connect)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import ConfigError, redact, resolve_dsn
from stethoscope.store.schema import cluster_ddl
from stethoscope.timeutil import now_ms

from conftest import database_held_elsewhere

T0 = now_ms() - 3_600_000  # within the raw TTL


def metrics(*rows) -> MetricColumns:
    batch = MetricColumns()
    for node, name, device, labels, value, ts in rows:
        batch.append(node, name, device, labels, value, ts)
    return batch


def count(store, where="1"):
    return store.query(f"SELECT count() FROM {store.database}.metrics FINAL WHERE {where}")[0][0]


def test_schema_is_idempotent(store):
    store.init_schema()
    tables = {
        row[0]
        for row in store.query(
            "SELECT name FROM system.tables WHERE database = {db:String}", {"db": store.database}
        )
    }
    assert {
        "metrics",
        "metrics_daily",
        "metrics_daily_mv",
        "metrics_hourly",
        "metrics_hourly_mv",
        "facts",
        "bench_results",
        "fingerprints",
        "nodes",
        "findings",
        "actions",
    } <= tables


def test_rows_differing_only_in_labels_never_collapse_but_a_resent_row_does(store):
    rows = metrics(
        ("n1", "gpu_xid_errors_total", "gpu0", {"xid": "79"}, 1, T0),
        ("n1", "gpu_xid_errors_total", "gpu0", {"xid": "48"}, 2, T0),
    )
    store.insert_metrics(rows)
    store.insert_metrics(rows)  # a replay of the same rows
    store.insert_metrics(metrics(("n1", "gpu_xid_errors_total", "gpu0", {"xid": "79"}, 1, T0)))
    assert count(store) == 2


def test_a_metric_insert_leaves_folding_to_merges_and_final_reads(store):
    # Folding each block as it lands slowed the stream's inserts at 2,000 eight-GPU nodes
    # (benchmarks/stream_scale.py): the replacing key folds at merge time, reads take FINAL (as they
    # must for two collectors' copies), and the rollups see every inserted row either way.
    row = ("n1", "gpu_temperature_celsius", "gpu0", {}, 41.0, T0)
    store.insert_metrics(metrics(row, row))
    assert store.query(f"SELECT count() FROM {store.database}.metrics")[0][0] == 2
    assert count(store) == 1
    hourly = f"SELECT sum(samples) FROM {store.database}.metrics_hourly WHERE node_id = 'n1'"
    assert store.query(hourly)[0][0] == 2


def test_label_order_does_not_make_a_new_series(store):
    store.insert_metrics(metrics(("n1", "net_mtu", "ib0", {"a": "1", "b": "2"}, 4096, T0)))
    store.insert_metrics(metrics(("n1", "net_mtu", "ib0", {"b": "2", "a": "1"}, 4096, T0)))
    assert count(store) == 1


def test_daily_rollup(store):
    store.insert_metrics(
        metrics(
            *[
                ("n1", "gpu_temperature_celsius", "gpu0", {}, v, T0 + i * 60_000)
                for i, v in enumerate([30, 50, 40])
            ]
        )
    )
    row = store.query(
        f"SELECT min(min_value), max(max_value), avgMerge(avg_value), argMaxMerge(last_value), sum(samples) "
        f"FROM {store.database}.metrics_daily WHERE node_id = 'n1'"
    )[0]
    assert row == (30, 50, 40, 40, 3)


def test_row_tables(store):
    batch = Batch()
    batch.facts.append(
        {"node_id": "n1", "collector": "gpu", "run_id": "r", "collected_at": T0, "facts": "{}"}
    )
    batch.nodes.append(
        {"node_id": "n1", "slurm_name": "n1", "rack": "r1", "switch": "s1", "groups": ["g"], "updated_at": T0}
    )
    assert store.write_batch(batch) == 2
    assert store.query(f"SELECT rack, groups FROM {store.database}.nodes FINAL") == [("r1", ["g"])]


def test_cluster_ddl_is_accepted_by_clickhouse_parser(store):
    statements = store.check_cluster_ddl("gpu_cluster")
    assert any("ReplicatedReplacingMergeTree" in s for s in statements)
    assert any("ENGINE = Distributed('gpu_cluster'" in s for s in statements)


def test_cluster_ddl_syntax_error_is_caught_by_the_parser(store):
    broken = cluster_ddl("x")[1].replace("ORDER BY", "ORDER")
    with pytest.raises(StoreError, match="Syntax error"):
        store.query("SELECT formatQuery({sql:String})", {"sql": broken})


def test_default_dsn_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.delenv("STETHOSCOPE_DSN", raising=False)
    monkeypatch.delenv("STETHOSCOPE_HOME", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)  # not a checkout: the user's state folder, never the package's checkout
    assert resolve_dsn("chdb://rel/db").startswith(f"chdb://{tmp_path}/rel/db?database=stethoscope")
    assert resolve_dsn() == f"chdb://{tmp_path}/state/stethoscope/db?database=stethoscope"
    monkeypatch.setenv("STETHOSCOPE_HOME", str(tmp_path / "home"))
    assert resolve_dsn() == f"chdb://{tmp_path}/home/.stethoscope/db?database=stethoscope"
    assert resolve_dsn("http://u:p@h:8123") == "http://u:p@h:8123/stethoscope"


def test_password_never_printed():
    assert redact("http://admin:s3cret@db:8123/x failed") == "http://admin:***@db:8123/x failed"
    with pytest.raises(StoreError) as caught:
        Store("http://admin:s3cret@127.0.0.1:1/x", timeout=2).open().query("SELECT 1")
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)


def test_embedded_database_held_by_another_process(tmp_path, monkeypatch):
    monkeypatch.setenv("STETHOSCOPE_OPEN_WAIT", "1")
    with (
        database_held_elsewhere(tmp_path / "db"),
        pytest.raises(StoreError, match="in use by another process"),
    ):
        Store(f"chdb://{tmp_path / 'db'}").open()


def test_password_in_the_query_string_never_printed():
    dsn = "http://127.0.0.1:1/x?user=admin&password=s3cret"
    with pytest.raises(StoreError) as caught:
        Store(dsn, timeout=2).open().query("SELECT 1")
    assert "s3cret" not in str(caught.value) and "admin:***@" in str(caught.value)  # moved into the address
    assert redact("https://h/x?pass=a1&pwd=b2") == "https://h/x?pass=***&pwd=***"


def test_unknown_dsn_option_is_a_configuration_error_naming_it():
    with pytest.raises(ConfigError, match="'bogus_opt' is not a clickhouse-connect option"):
        Store("http://127.0.0.1:1/x?bogus_opt=1&password=s3cret", timeout=2).open()


def test_regular_file_as_embedded_path_says_not_a_database(tmp_path):
    (tmp_path / "db").write_text("not a database\n")
    with pytest.raises(ConfigError, match="not a database: it is a file") as caught:
        Store(f"chdb://{tmp_path / 'db'}").open()
    assert "in use" not in str(caught.value)


def test_proc_path_as_embedded_path_says_not_a_database():
    with pytest.raises(ConfigError, match="not a database: the folder cannot be created"):
        Store("chdb:///proc/stethoscope-db").open()


def test_held_database_waits_then_says_who_holds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("STETHOSCOPE_OPEN_WAIT", "2")
    with (
        database_held_elsewhere(tmp_path / "db") as holder,
        pytest.raises(StoreError, match="in use by another process") as caught,
    ):
        Store(f"chdb://{tmp_path / 'db'}").open()
    assert f"held by pid {holder.pid} (" in str(caught.value) and "waited 2 s" in str(caught.value)


def test_held_database_released_within_the_wait_opens(tmp_path, monkeypatch):
    monkeypatch.setenv("STETHOSCOPE_OPEN_WAIT", "60")
    with (
        database_held_elsewhere(tmp_path / "db", seconds=2) as holder,
        Store(f"chdb://{tmp_path / 'db'}") as store,
    ):
        assert store.query("SELECT count() FROM stethoscope.metrics") == [(0,)]
        holder.wait()
        assert json.loads((tmp_path / "db.holder").read_text())["pid"] == os.getpid()
    assert not (tmp_path / "db.holder").exists()


def test_stale_holder_file_of_a_dead_process_is_ignored(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / "db.holder").write_text(json.dumps({"pid": int(dead.stdout), "command": "x", "since": 0}))
    with Store(f"chdb://{tmp_path / 'db'}", open_wait=0) as store:
        assert store.query("SELECT 1") == [(1,)]
