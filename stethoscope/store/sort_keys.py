"""Tables an older `db init` created sorted node first: the raw table and its rollups are sorted metric
first since 2026-12-07 (a rule reads one metric on every node; docs/design.md "Storage"). ClickHouse
cannot reorder a table's key in place, so an existing database keeps its own and reads the same rows,
at the old cost; `db init` names those tables."""

from __future__ import annotations

from stethoscope.store.client import Store

METRIC_FIRST = ("metrics", "metrics_daily", "metrics_hourly")


def node_first_tables(store: Store) -> list[str]:
    """The tables of METRIC_FIRST (on a cluster their local tables) still sorted node first."""
    names = [*METRIC_FIRST, *(f"{name}_local" for name in METRIC_FIRST)]
    rows = store.query(
        "SELECT name FROM system.tables WHERE database = {db:String} AND name IN {names:Array(String)} "
        "AND startsWith(sorting_key, 'node_id') ORDER BY name",
        {"db": store.database, "names": names},
    )
    return [f"{store.database}.{name}" for (name,) in rows]
