"""The schema on a ClickHouse cluster (`db init --cluster NAME`): schema.cluster_ddl sent to one of its
servers, which runs each statement ON CLUSTER on every host (through Keeper's distributed DDL queue).

The embedded store (chdb) is one process without Keeper: it cannot create a Replicated table, so
`--cluster` with it is refused before anything is opened.
"""

from __future__ import annotations

import re
from typing import Protocol

from stethoscope.store.dsn import ConfigError, is_embedded, redact
from stethoscope.store.schema import DEFAULT_RAW_TTL_DAYS, cluster_ddl, hourly_backfill, tables

# a name ClickHouse reads unquoted inside '...', or the server's own {cluster} macro
CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_.{}-]+$")


class Commands(Protocol):
    dsn: str
    database: str

    def command(self, sql: str, parameters: dict | None = None) -> object: ...

    def query(self, sql: str, parameters: dict | None = None) -> list[tuple]: ...


def cluster_name(value: str) -> str:
    """`--cluster NAME` as given, or ValueError: it is written into every statement between quotes."""
    if not CLUSTER_NAME.match(value):
        raise ValueError(f"--cluster {value!r}: a cluster name is made of A-Za-z0-9_.-{{}} only")
    return value


def existing_engines(store: Commands) -> dict[str, str]:
    """name -> engine of the tables of the database (none before `db init`)."""
    rows = store.query(
        "SELECT name, engine FROM system.tables WHERE database = {db:String}", {"db": store.database}
    )
    return {name: engine for name, engine in rows}


def refuse_other_layout(store: Commands, cluster: str | None) -> None:
    """ConfigError (exit 2) where the database holds the contract's tables in the other layout: a
    clustered database's names are Distributed tables, a single-node one's are not. Creating the other
    layout beside them would be skipped table by table (IF NOT EXISTS) and leave a mix."""
    engines = existing_engines(store)
    for table in tables():
        engine = engines.get(table.name)
        if engine is None:
            continue
        if cluster is not None and engine != "Distributed":
            raise ConfigError(
                f"--cluster {cluster}: {store.database}.{table.name} exists as a {engine} table: the "
                "database was created single-node; create the cluster schema in another database"
            )
        if cluster is None and engine == "Distributed":
            raise ConfigError(
                f"{store.database}.{table.name} is a Distributed table: the database was created on a "
                "cluster; give `db init --cluster NAME` its cluster"
            )


def refuse_embedded(dsn: str, cluster: str) -> None:
    """ConfigError (exit 2) where `dsn` is the embedded store: it has no Keeper to replicate through."""
    if is_embedded(dsn):
        raise ConfigError(
            f"--cluster {cluster}: {redact(dsn)} is the embedded store, one process without ClickHouse "
            "Keeper, which Replicated tables need: give the --dsn of a ClickHouse server of the cluster "
            "(`db ddl --cluster NAME` prints the statements)"
        )


def init_cluster_schema(store: Commands, cluster: str, raw_ttl_days: int = DEFAULT_RAW_TTL_DAYS) -> list[str]:
    """Create the Replicated and Distributed tables on every host of `cluster`, in order (a Distributed
    table after its local one, the views after their tables); idempotent (IF NOT EXISTS). A metrics
    table older than the hourly rollup gets its rollup backfilled, through the Distributed tables."""
    refuse_embedded(store.dsn, cluster)
    refuse_other_layout(store, cluster)
    before = existing_engines(store)
    statements = cluster_ddl(store.database, cluster, raw_ttl_days)
    for statement in statements:
        store.command(statement)
    if "metrics_local" in before and "metrics_hourly_local" not in before:
        # as single-node (Store.init_schema): the views exist first, so a row written meanwhile is
        # counted twice rather than lost
        statements.append(hourly_backfill(store.database))
        store.command(statements[-1])
    return statements
