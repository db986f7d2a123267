"""The store against real embedded ClickHouse (chdb through clickhouse-connect)."""

from __future__ import annotations

import pytest

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import redact, resolve_dsn
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
    monkeypatch.chdir(tmp_path)
    assert resolve_dsn("chdb://rel/db").startswith(f"chdb://{tmp_path}/rel/db?database=stethoscope")
    assert resolve_dsn().startswith("chdb:///") and "/.stethoscope/db?database=stethoscope" in resolve_dsn()
    assert resolve_dsn("http://u:p@h:8123") == "http://u:p@h:8123/stethoscope"


def test_password_never_printed():
    assert redact("http://admin:s3cret@db:8123/x failed") == "http://admin:***@db:8123/x failed"
    with pytest.raises(StoreError) as caught:
        Store("http://admin:s3cret@127.0.0.1:1/x", timeout=2).open().query("SELECT 1")
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)


def test_embedded_database_held_by_another_process(tmp_path):
    with (
        database_held_elsewhere(tmp_path / "db"),
        pytest.raises(StoreError, match="in use by another process"),
    ):
        Store(f"chdb://{tmp_path / 'db'}").open()
