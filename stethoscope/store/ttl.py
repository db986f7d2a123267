"""The raw TTL (metrics, facts) of an existing database: read it, change it (`db init --ttl-days`).

What the database says is the one raw TTL: the rules read it once per cycle (`raw_ttl_seconds`) to
know which windows reach past the raw rows into the daily rollup, `ingest` to warn about rows it
would expire. DEFAULT_RAW_TTL_DAYS is only what `db init` gives a new database."""

from __future__ import annotations

import re

from stethoscope.store.client import Store, StoreError
from stethoscope.store.schema import DEFAULT_RAW_TTL_DAYS, tables

_DAYS = re.compile(r"TTL .*?(?:toIntervalDay\((\d+)\)|INTERVAL (\d+) DAY)", re.DOTALL)


def raw_tables(days: int) -> dict[str, str]:
    """name -> TTL expression of the tables whose TTL is the raw one (it moves with `days`)."""
    one, other = tables(raw_ttl_days=days), {t.name: t.ttl for t in tables(raw_ttl_days=days + 1)}
    return {t.name: t.ttl for t in one if t.ttl and t.ttl != other.get(t.name)}


def raw_ttl_days(store: Store) -> int | None:
    """The metrics table's TTL in days (on a cluster its local table's: the Distributed one has
    none), or None when there is no metrics table yet."""
    rows = store.query(
        "SELECT create_table_query FROM system.tables WHERE database = {db:String} "
        "AND name IN ('metrics', 'metrics_local') ORDER BY name",
        {"db": store.database},
    )
    for (query,) in rows:
        found = _DAYS.search(query)
        if found:
            return int(found.group(1) or found.group(2))
    return None


def raw_ttl_seconds(store: Store) -> int:
    """The raw TTL the rules read by: the store's own; a store without a metrics table yet has no
    rows to lose, and is given the TTL `db init` would create it with."""
    return (raw_ttl_days(store) or DEFAULT_RAW_TTL_DAYS) * 86400


def change_raw_ttl(store: Store, days: int, cluster: str | None = None) -> list[str]:
    """ALTER every raw table to `days` (on a cluster: its local tables, on every host); returns the
    tables changed."""
    changed = []
    for name, expression in raw_tables(days).items():
        table = f"{name}_local ON CLUSTER '{cluster}'" if cluster else name
        store.command(f"ALTER TABLE {store.database}.{table} MODIFY TTL {expression}")
        changed.append(name)
    return changed


def read_raw_ttl_days(dsn: str | None, database: str | None, timeout: float = 5.0) -> int | None:
    """The raw TTL if the store answers now; None when it does not (or has no schema yet)."""
    try:
        with Store(dsn, database, timeout=timeout, open_wait=0) as store:
            return raw_ttl_days(store)
    except StoreError:
        return None
