"""The raw TTL (metrics, facts) of an existing database: read it, change it (`db init --ttl-days`)."""

from __future__ import annotations

import re

from stethoscope.store.client import Store, StoreError
from stethoscope.store.schema import tables

DEFAULT_RAW_TTL_DAYS = 30
_DAYS = re.compile(r"TTL .*?(?:toIntervalDay\((\d+)\)|INTERVAL (\d+) DAY)", re.DOTALL)


def raw_tables(days: int) -> dict[str, str]:
    """name -> TTL expression of the tables whose TTL is the raw one (it moves with `days`)."""
    one, other = tables(raw_ttl_days=days), {t.name: t.ttl for t in tables(raw_ttl_days=days + 1)}
    return {t.name: t.ttl for t in one if t.ttl and t.ttl != other.get(t.name)}


def raw_ttl_days(store: Store) -> int | None:
    """The metrics table's TTL in days, or None when there is no metrics table yet."""
    rows = store.query(
        "SELECT create_table_query FROM system.tables WHERE database = {db:String} AND name = 'metrics'",
        {"db": store.database},
    )
    if not rows:
        return None
    found = _DAYS.search(rows[0][0])
    return int(found.group(1) or found.group(2)) if found else None


def change_raw_ttl(store: Store, days: int) -> list[str]:
    """ALTER every raw table to `days`; returns the tables changed."""
    changed = []
    for name, expression in raw_tables(days).items():
        store.command(f"ALTER TABLE {store.database}.{name} MODIFY TTL {expression}")
        changed.append(name)
    return changed


def read_raw_ttl_days(dsn: str | None, database: str | None, timeout: float = 5.0) -> int | None:
    """The raw TTL if the store answers now; None when it does not (or has no schema yet)."""
    try:
        with Store(dsn, database, timeout=timeout, open_wait=0) as store:
            return raw_ttl_days(store)
    except StoreError:
        return None
