"""Table definitions of docs/design.md, rendered for one server (embedded or not) or for a cluster.

One definition per table; `single_node_ddl` and `cluster_ddl` render it, so the two never drift.
Rows that differ only in labels must not collapse while a replayed row does: the sorting keys carry
`labels_key`, a canonical (key-sorted) string of the labels map.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LABELS_KEY = "labels_key String MATERIALIZED toString(mapSort(labels))"
# The raw TTL (metrics, facts) of a new database unless `db init --ttl-days` says otherwise; an existing
# database keeps its own, which the rules read back from it each cycle (store.ttl).
DEFAULT_RAW_TTL_DAYS = 30
HOURLY_TTL_DAYS = 90  # metrics_hourly's: fixed, whatever the raw TTL


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    engine: str  # MergeTree family name without "Replicated", e.g. "ReplacingMergeTree"
    order_by: str
    engine_args: str = ""
    partition_by: str = ""
    ttl: str = ""
    settings: tuple[str, ...] = field(default_factory=tuple)


METRIC_COLUMNS = (
    "node_id LowCardinality(String)",
    "metric_name LowCardinality(String)",
    "device LowCardinality(String)",
    "labels Map(String, String)",
    "value Float64",
    "timestamp DateTime64(3, 'UTC')",
    LABELS_KEY,
)
# the raw table metric first: a rule reads one metric on every node, and node first the primary-key
# search at each query's planning walked every mark of the day's parts (16 ms at 200 nodes, 125 ms at
# 2,000, every read of every cycle); metric first, the metric's rows are one range of each part. The
# rollups too (a read of one metric no longer reads every granule). fault_windows is read by node.
METRIC_ORDER = "(metric_name, node_id, device, labels_key, timestamp)"
FAULT_WINDOW_ORDER = "(node_id, metric_name, device, labels_key, timestamp)"


def tables(
    raw_ttl_days: int = DEFAULT_RAW_TTL_DAYS,
    daily_ttl_days: int = 730,
    hourly_ttl_days: int = HOURLY_TTL_DAYS,
    fault_ttl_days: int = 730,
) -> list[Table]:
    return [
        Table(
            "metrics",
            METRIC_COLUMNS,
            "ReplacingMergeTree",
            METRIC_ORDER,
            partition_by="toYYYYMMDD(timestamp)",
            ttl=f"toDateTime(timestamp) + INTERVAL {int(raw_ttl_days)} DAY",
            # a series holds ~17k rows a day at 5 s: with 8192-row granules and 64 KiB blocks a rule's
            # 5-minute window of one metric decompresses whole days of it on every node; small ones
            # halve the rules' cost at 200 nodes (benchmarks/diagnosis_cycle.py); 256-row ones gained
            # nothing more. New tables only, as the sorting key: an existing table keeps its own.
            settings=("index_granularity = 1024", "min_compress_block_size = 8192"),
        ),
        # the raw rows of a fault's node before its impact, kept for the audit after the raw TTL
        Table(
            "fault_windows",
            METRIC_COLUMNS,
            "ReplacingMergeTree",
            FAULT_WINDOW_ORDER,
            partition_by="toYYYYMM(timestamp)",
            ttl=f"toDateTime(timestamp) + INTERVAL {int(fault_ttl_days)} DAY",
        ),
        Table(  # the ground truth of the audit: one row per fault, the same fault imported twice is one
            "faults",
            (
                "fault_id String",
                "node_id String",
                "device String",
                "kind LowCardinality(String)",
                "layer LowCardinality(String)",
                "impact_at DateTime64(3, 'UTC')",
                "source LowCardinality(String)",
                "note String",
                "recorded_at DateTime64(3, 'UTC')",
            ),
            "ReplacingMergeTree",
            "fault_id",
            engine_args="recorded_at",
        ),
        Table(
            "metrics_daily",
            (
                "node_id LowCardinality(String)",
                "metric_name LowCardinality(String)",
                "device LowCardinality(String)",
                "labels SimpleAggregateFunction(any, Map(String, String))",
                "labels_key String",
                "day Date",
                "min_value SimpleAggregateFunction(min, Float64)",
                "max_value SimpleAggregateFunction(max, Float64)",
                "avg_value AggregateFunction(avg, Float64)",
                "last_value AggregateFunction(argMax, Float64, DateTime64(3, 'UTC'))",
                "samples SimpleAggregateFunction(sum, UInt64)",
            ),
            "AggregatingMergeTree",
            "(metric_name, node_id, device, labels_key, day)",  # metric first, as METRIC_ORDER
            partition_by="toYYYYMM(day)",
            ttl=f"day + INTERVAL {int(daily_ttl_days)} DAY",
        ),
        Table(
            "metrics_hourly",
            (
                "node_id LowCardinality(String)",
                "metric_name LowCardinality(String)",
                "device LowCardinality(String)",
                "labels SimpleAggregateFunction(any, Map(String, String))",
                "labels_key String",
                "hour DateTime('UTC')",
                "min_value SimpleAggregateFunction(min, Float64)",
                "max_value SimpleAggregateFunction(max, Float64)",
                # the time of the maximum; of equal maxima the earliest, so merges cannot change it
                "max_at AggregateFunction(argMax, DateTime64(3, 'UTC'), Tuple(Float64, Int64))",
                "avg_value AggregateFunction(avg, Float64)",
                "last_value AggregateFunction(argMax, Float64, DateTime64(3, 'UTC'))",
                "first_at SimpleAggregateFunction(min, DateTime64(3, 'UTC'))",
                "last_at SimpleAggregateFunction(max, DateTime64(3, 'UTC'))",
                "samples SimpleAggregateFunction(sum, UInt64)",
            ),
            "AggregatingMergeTree",
            "(metric_name, node_id, device, labels_key, hour)",  # metric first, as METRIC_ORDER
            partition_by="toYYYYMMDD(hour)",
            ttl=f"hour + INTERVAL {int(hourly_ttl_days)} DAY",
        ),
        Table(
            "facts",
            (
                "node_id LowCardinality(String)",
                "collector LowCardinality(String)",
                "run_id String",
                "collected_at DateTime64(3, 'UTC')",
                "facts String",
            ),
            "ReplacingMergeTree",
            "(node_id, collector, collected_at, run_id)",
            partition_by="toYYYYMM(collected_at)",
            ttl=f"toDateTime(collected_at) + INTERVAL {int(raw_ttl_days)} DAY",
        ),
        Table(
            "bench_results",
            (
                "run_id String",
                "node_id LowCardinality(String)",
                "suite LowCardinality(String)",
                "metric_name LowCardinality(String)",
                "device LowCardinality(String)",
                "labels Map(String, String)",
                "value Float64",
                "unit LowCardinality(String)",
                "repetition UInt16",
                "class_fingerprint String",
                "node_fingerprint String",
                "unstable UInt8",
                "timestamp DateTime64(3, 'UTC')",
                LABELS_KEY,
            ),
            "ReplacingMergeTree",
            "(suite, metric_name, node_id, device, labels_key, run_id, repetition)",
            partition_by="toYYYYMM(timestamp)",
        ),
        Table(
            "fingerprints",
            (
                "fingerprint String",
                "kind LowCardinality(String)",
                "node_id LowCardinality(String)",
                "detail String",
                "first_seen DateTime64(3, 'UTC')",
            ),
            "ReplacingMergeTree",
            "(fingerprint, kind, node_id)",
        ),
        Table(
            "nodes",
            (
                "node_id String",
                "slurm_name String",
                "rack LowCardinality(String)",
                "switch LowCardinality(String)",
                "groups Array(String)",
                "updated_at DateTime64(3, 'UTC')",
            ),
            "ReplacingMergeTree",
            "node_id",
            engine_args="updated_at",
        ),
        Table(
            "findings",
            (
                "finding_id String",
                "txn_id String",
                "rule_id LowCardinality(String)",
                "node_id LowCardinality(String)",
                "device String",
                "severity LowCardinality(String)",
                "confidence Float32",
                "level LowCardinality(String)",
                "message String",
                "evidence String",
                "first_seen DateTime64(3, 'UTC')",
                "last_seen DateTime64(3, 'UTC')",
                "status LowCardinality(String)",
                "version UInt64",
            ),
            "ReplacingMergeTree",
            "finding_id",
            engine_args="version",
        ),
        Table(
            "actions",
            (
                "txn_id String",
                "finding_id String",
                "action LowCardinality(String)",
                "target String",
                "status LowCardinality(String)",
                "detail String",
                "started_at DateTime64(3, 'UTC')",
                "finished_at Nullable(DateTime64(3, 'UTC'))",
                "version UInt64",
            ),
            "ReplacingMergeTree",
            "(txn_id, finding_id, action, target)",
            engine_args="version",
        ),
        Table(  # one row per cycle that recorded its findings: the board's "evaluated" (never green without)
            "evaluations",
            (
                "at DateTime64(3, 'UTC')",
                "mode LowCardinality(String)",  # dry-run | execute
                "rules UInt32",
                "nodes Array(String)",  # the inventory's hosts evaluated; empty: every node of the store
                "findings UInt32",
                "host String",
            ),
            "MergeTree",
            "at",
            partition_by="toYYYYMM(at)",
            ttl=f"toDateTime(at) + INTERVAL {int(daily_ttl_days)} DAY",
        ),
        Table(  # one row per executor process, rewritten every cycle: who may act (the oldest live)
            "executors",
            (
                "host String",
                "pid UInt32",
                "started_at DateTime64(3, 'UTC')",
                "beat_at DateTime64(3, 'UTC')",
                "version UInt64",
            ),
            "ReplacingMergeTree",
            "(host, pid, started_at)",
            engine_args="version",
        ),
        Table(  # `stethoscope silence`: matchers (JSON) ANDed; expiring writes a version ending now
            "silences",
            (
                "silence_id String",
                "matchers String",
                "starts_at DateTime64(3, 'UTC')",
                "ends_at DateTime64(3, 'UTC')",
                "created_by String",
                "reason String",
                "version UInt64",
            ),
            "ReplacingMergeTree",
            "silence_id",
            engine_args="version",
        ),
    ]


# The views group by the labels map beside its canonical key rather than take any(labels): the same
# rows, and a 53,000-row stream insert 0.18 s instead of 0.36 s (0.05 s without the views). The same
# labels in another order give two rows of one key in an insert; the merges and every read fold them.
DAILY_SELECT = """SELECT node_id, metric_name, device, labels, labels_key, toDate(timestamp) AS day,
  min(value) AS min_value, max(value) AS max_value, avgState(value) AS avg_value,
  argMaxState(value, timestamp) AS last_value, count() AS samples
FROM {db}.{source}
GROUP BY node_id, metric_name, device, labels_key, labels, day"""
DAILY_VIEW = (
    "CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.metrics_daily_mv{on_cluster} TO {db}.{target}\nAS "
    + DAILY_SELECT
)


HOURLY_COLUMNS = (
    "node_id, metric_name, device, labels, labels_key, hour, min_value, max_value, max_at, avg_value, "
    "last_value, first_at, last_at, samples"
)
HOURLY_SELECT = """SELECT node_id, metric_name, device, labels, labels_key,
  toStartOfHour(timestamp) AS hour, min(value) AS min_value, max(value) AS max_value,
  argMaxState(timestamp, (value, -toUnixTimestamp64Milli(timestamp))) AS max_at,
  avgState(value) AS avg_value, argMaxState(value, timestamp) AS last_value,
  min(timestamp) AS first_at, max(timestamp) AS last_at, count() AS samples
FROM {db}.{source}
GROUP BY node_id, metric_name, device, labels_key, labels, hour"""
HOURLY_VIEW = (
    "CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.metrics_hourly_mv{on_cluster} TO {db}.{target}\nAS "
    + HOURLY_SELECT
)


# Each view's query on one server, to bring an older database's views to it (Store.upgrade_views), and
# what marks a view of the older query (before 2026-12-07).
VIEW_SELECTS = {"metrics_daily_mv": DAILY_SELECT, "metrics_hourly_mv": HOURLY_SELECT}
OLDER_VIEW_MARK = "any(labels)"


def hourly_backfill(db: str) -> str:
    """Fill a just-created metrics_hourly from the raw rows (FINAL: each stored row counted once)."""
    select = HOURLY_SELECT.format(db=db, source="metrics FINAL")
    return f"INSERT INTO {db}.metrics_hourly ({HOURLY_COLUMNS})\n{select}"


def _table_ddl(db: str, table: Table, name: str, engine: str, on_cluster: str) -> str:
    parts = [
        f"CREATE TABLE IF NOT EXISTS {db}.{name}{on_cluster}\n(\n    "
        + ",\n    ".join(table.columns)
        + "\n)",
        f"ENGINE = {engine}",
    ]
    if table.partition_by:
        parts.append(f"PARTITION BY {table.partition_by}")
    parts.append(f"ORDER BY {table.order_by}")
    if table.ttl:
        parts.append(f"TTL {table.ttl}")
    if table.settings:
        parts.append("SETTINGS " + ", ".join(table.settings))
    return "\n".join(parts)


def shard_key(table: Table) -> str:
    """The Distributed table's sharding key. A replacing or aggregating table collapses the versions of
    one row only where they meet, on one shard: its key hashes sorting-key columns only, node_id where
    the sorting key holds it (a node's series and their rollups on one shard, its rules' reads local)."""
    if table.engine == "MergeTree":
        return "rand()"
    sorting = [column.strip() for column in table.order_by.strip("()").split(",")]
    return "cityHash64(node_id)" if "node_id" in sorting else f"cityHash64({', '.join(sorting)})"


def single_node_ddl(db: str, raw_ttl_days: int = DEFAULT_RAW_TTL_DAYS) -> list[str]:
    statements = [f"CREATE DATABASE IF NOT EXISTS {db}"]
    for table in tables(raw_ttl_days):
        statements.append(_table_ddl(db, table, table.name, f"{table.engine}({table.engine_args})", ""))
    statements.append(DAILY_VIEW.format(db=db, on_cluster="", target="metrics_daily", source="metrics"))
    statements.append(HOURLY_VIEW.format(db=db, on_cluster="", target="metrics_hourly", source="metrics"))
    return statements


def cluster_ddl(db: str, cluster: str = "{cluster}", raw_ttl_days: int = DEFAULT_RAW_TTL_DAYS) -> list[str]:
    """Replicated local tables `<name>_local` plus Distributed tables under the contract's names."""
    on_cluster = f" ON CLUSTER '{cluster}'"
    statements = [f"CREATE DATABASE IF NOT EXISTS {db}{on_cluster}"]
    for table in tables(raw_ttl_days):
        args = f"'/clickhouse/tables/{{shard}}/{db}/{table.name}', '{{replica}}'"
        if table.engine_args:
            args += f", {table.engine_args}"
        local = f"{table.name}_local"
        statements.append(_table_ddl(db, table, local, f"Replicated{table.engine}({args})", on_cluster))
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {db}.{table.name}{on_cluster} AS {db}.{local}\n"
            f"ENGINE = Distributed('{cluster}', '{db}', '{local}', {shard_key(table)})"
        )
    statements.append(
        DAILY_VIEW.format(db=db, on_cluster=on_cluster, target="metrics_daily_local", source="metrics_local")
    )
    statements.append(
        HOURLY_VIEW.format(
            db=db, on_cluster=on_cluster, target="metrics_hourly_local", source="metrics_local"
        )
    )
    return statements
