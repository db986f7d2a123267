"""The schema beyond one machine (`db init --cluster NAME`, `db ddl --cluster NAME`): Replicated local
tables and a Distributed table under each name readers and writers use, every statement read by
ClickHouse's own parser (chdb embeds it), the versions of one row kept on one shard, and the embedded
store refused (it has no Keeper to replicate through)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stethoscope.store.cluster import init_cluster_schema, refuse_other_layout
from stethoscope.store.dsn import ConfigError
from stethoscope.store.schema import cluster_ddl, tables
from stethoscope.store.ttl import change_raw_ttl

TOP = Path(__file__).resolve().parents[2]
CLUSTER = "gpu_cluster"
DB_INIT_CLUSTER = ("db", "init", "--cluster", CLUSTER)


class Recorder:
    """A server's store as far as the schema needs it: the statements sent, nothing run."""

    def __init__(self, database: str = "stethoscope", existing: dict[str, str] | None = None) -> None:
        self.dsn = "http://clickhouse-1:8123/stethoscope"
        self.database = database
        self.existing = existing or {}  # name -> engine of the tables already there
        self.commands: list[str] = []

    def command(self, sql: str, parameters: dict | None = None) -> None:
        self.commands.append(sql)

    def query(self, sql: str, parameters: dict | None = None) -> list[tuple]:
        assert "system.tables" in sql, sql
        return sorted(self.existing.items())


def _distributed(statements: list[str], name: str) -> str:
    (statement,) = [
        s for s in statements if re.search(rf"\.{name} ON CLUSTER .*ENGINE = Distributed", s, re.S)
    ]
    return statement


def _columns(expression: str) -> set[str]:
    return set(re.findall(r"\w+", expression)) - {"cityHash64", "rand"}


def test_every_cluster_statement_is_read_by_clickhouses_parser(store) -> None:
    for statement in cluster_ddl(store.database, CLUSTER):
        formatted = store.query("SELECT formatQuery({sql:String})", {"sql": statement})[0][0]
        assert formatted.startswith("CREATE"), statement


def test_each_table_is_replicated_locally_with_its_ttl_and_distributed_under_its_own_name() -> None:
    statements = cluster_ddl("stethoscope", CLUSTER, raw_ttl_days=12)
    assert all(f" ON CLUSTER '{CLUSTER}'" in s for s in statements)
    for table in tables(raw_ttl_days=12):
        (local,) = [s for s in statements if f"stethoscope.{table.name}_local ON CLUSTER" in s.split("\n")[0]]
        assert f"ENGINE = Replicated{table.engine}('/clickhouse/tables/{{shard}}/stethoscope/" in local
        assert "'{replica}'" in local
        assert (f"TTL {table.ttl}" in local) == bool(table.ttl)
        assert f"Distributed('{CLUSTER}', 'stethoscope', '{table.name}_local'" in _distributed(
            statements, table.name
        )
    views = [s for s in statements if "MATERIALIZED VIEW" in s]
    assert len(views) == 2 and all("FROM stethoscope.metrics_local" in v for v in views)


def test_the_versions_of_one_row_are_sharded_together() -> None:
    """A replacing (or aggregating) table collapses the versions of a row only where they meet: on one
    shard. Its sharding key reads only its sorting key's columns (node_id where the key has it, so a
    node's series and rollups stay together)."""
    statements = cluster_ddl("stethoscope", CLUSTER)
    for table in tables():
        key = re.search(r"ENGINE = Distributed\(.*, (\w+\(.*\))\)$", _distributed(statements, table.name))[1]
        sorting = _columns(table.order_by)
        if table.engine == "MergeTree":
            continue
        assert key != "rand()" and _columns(key) <= sorting, (table.name, key)
        if "node_id" in sorting:
            assert key == "cityHash64(node_id)", table.name


def _created(statement: str) -> str:
    return re.match(r"CREATE (?:TABLE|MATERIALIZED VIEW|DATABASE) IF NOT EXISTS ([\w.]+)", statement)[1]


def test_init_on_a_server_sends_each_statement_on_cluster_local_tables_then_distributed_then_views() -> None:
    server = Recorder()
    init_cluster_schema(server, CLUSTER, raw_ttl_days=9)
    assert server.commands and all(f" ON CLUSTER '{CLUSTER}'" in s.split("\n")[0] for s in server.commands)
    created = [_created(statement) for statement in server.commands]
    assert created[0] == "stethoscope"
    for table in tables(raw_ttl_days=9):
        local, distributed = f"stethoscope.{table.name}_local", f"stethoscope.{table.name}"
        assert created.index(local) < created.index(distributed), table.name
    views = [i for i, s in enumerate(server.commands) if "MATERIALIZED VIEW" in s]
    assert len(views) == 2 and min(views) > max(
        i for i, s in enumerate(server.commands) if "ENGINE = Distributed" in s
    )
    assert "INTERVAL 9 DAY" in server.commands[created.index("stethoscope.metrics_local")]


def test_init_on_a_cluster_backfills_the_hourly_rollup_of_an_existing_metrics_table() -> None:
    server = Recorder(existing={"metrics": "Distributed", "metrics_local": "ReplicatedReplacingMergeTree"})
    init_cluster_schema(server, CLUSTER)
    (backfill,) = [s for s in server.commands if s.startswith("INSERT")]
    assert backfill.startswith("INSERT INTO stethoscope.metrics_hourly ")
    assert "FROM stethoscope.metrics FINAL" in backfill
    fresh = Recorder()
    init_cluster_schema(fresh, CLUSTER)
    assert not [s for s in fresh.commands if s.startswith("INSERT")]


def test_init_on_a_cluster_refuses_a_database_created_single_node() -> None:
    server = Recorder(existing={"metrics": "ReplacingMergeTree", "facts": "ReplacingMergeTree"})
    with pytest.raises(ConfigError, match=r"stethoscope\.metrics exists as a ReplacingMergeTree table"):
        refuse_other_layout(server, CLUSTER)
    with pytest.raises(ConfigError, match="single-node"):
        init_cluster_schema(server, CLUSTER)
    assert server.commands == []
    refuse_other_layout(server, None)


def test_single_node_init_refuses_a_clustered_database() -> None:
    server = Recorder(existing={"metrics": "Distributed", "metrics_local": "ReplicatedReplacingMergeTree"})
    with pytest.raises(ConfigError, match=r"stethoscope\.metrics is a Distributed table.*--cluster"):
        refuse_other_layout(server, None)
    refuse_other_layout(server, CLUSTER)
    refuse_other_layout(Recorder(), None)


def test_single_node_db_init_twice_passes_the_layout_check(store) -> None:
    refuse_other_layout(store, None)
    with pytest.raises(ConfigError, match="single-node"):
        refuse_other_layout(store, CLUSTER)


def test_the_store_reads_a_clustered_database_in_one_piece(store) -> None:
    """On a cluster every contract name is a Distributed table: the controller's IN and JOIN subqueries
    are distributed twice (refused under ClickHouse's default `deny`), and an insert returns before it
    reached its shard unless it is written in the foreground (the ledger reads right after writing)."""
    settings = store.query(
        "SELECT getSetting('distributed_product_mode'), toUInt8(getSetting('distributed_foreground_insert'))"
    )
    assert settings == [("global", 1)]
    reader = store.reader()
    try:
        assert reader.query("SELECT getSetting('distributed_product_mode')") == [("global",)]
    finally:
        reader.close()


@pytest.mark.parametrize("name", ["", "gpu'cluster", "a b", "x;DROP"])
def test_a_cluster_name_outside_the_safe_characters_is_a_usage_error(tmp_path: Path, name: str) -> None:
    for command in ("ddl", "init"):
        run = _cli(tmp_path, "db", command, "--cluster", name)
        assert run.returncode == 2, (command, name, run.stdout)
        assert "--cluster" in run.stderr and "A-Za-z0-9" in run.stderr


def test_the_cluster_macro_is_a_cluster_name(tmp_path: Path) -> None:
    run = _cli(tmp_path, "db", "ddl", "--cluster", "{cluster}")
    assert run.returncode == 0, run.stderr
    assert "ON CLUSTER '{cluster}'" in run.stdout


def test_init_refuses_the_embedded_store() -> None:
    embedded = Recorder()
    embedded.dsn = "chdb:///var/lib/stethoscope/db?database=stethoscope"
    with pytest.raises(ConfigError, match="Keeper"):
        init_cluster_schema(embedded, CLUSTER)
    assert embedded.commands == []


def test_raw_ttl_change_on_a_cluster_alters_the_local_tables_on_every_host(store) -> None:
    server = Recorder(store.database)
    changed = change_raw_ttl(server, 14, cluster=CLUSTER)
    assert changed == ["metrics", "facts"]
    assert server.commands == [
        f"ALTER TABLE {store.database}.{name}_local ON CLUSTER '{CLUSTER}' MODIFY TTL "
        + {t.name: t.ttl for t in tables(raw_ttl_days=14)}[name]
        for name in changed
    ]
    for statement in server.commands:
        store.query("SELECT formatQuery({sql:String})", {"sql": statement})


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "--dsn", f"chdb://{tmp_path / 'db'}", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TOP), "STETHOSCOPE_HOME": str(tmp_path)},
        timeout=120,
    )


def test_db_init_cluster_on_the_embedded_store_is_a_usage_error(tmp_path: Path) -> None:
    run = _cli(tmp_path, *DB_INIT_CLUSTER)
    assert run.returncode == 2, run.stderr
    assert "Keeper" in run.stderr and "ClickHouse server" in run.stderr
    assert not (tmp_path / "db").exists()
