"""ClickHouse access through clickhouse-connect: the embedded chdb engine and a server alike.

Writers open, write and close: one process at a time may hold an embedded path. Every statement
names the database; values travel as parameters or columnar inserts, never spliced into SQL.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from stethoscope.store import holder
from stethoscope.store.batch import METRIC_COLUMNS, Batch, MetricColumns
from stethoscope.store.dsn import ConfigError, database_of, embedded_path, is_embedded, redact, resolve_dsn
from stethoscope.store.errors import SchemaMissing, StoreError
from stethoscope.store.schema import (
    DEFAULT_RAW_TTL_DAYS,
    OLDER_VIEW_MARK,
    VIEW_SELECTS,
    cluster_ddl,
    hourly_backfill,
    single_node_ddl,
)

# clickhouse-connect logs a traceback for every failed insert; our callers report the error themselves.
logging.getLogger("clickhouse_connect").setLevel(logging.CRITICAL)

ROW_TABLES: dict[str, tuple[str, ...]] = {
    "facts": ("node_id", "collector", "run_id", "collected_at", "facts"),
    "bench_results": (
        "run_id",
        "node_id",
        "suite",
        "metric_name",
        "device",
        "labels",
        "value",
        "unit",
        "repetition",
        "class_fingerprint",
        "node_fingerprint",
        "unstable",
        "timestamp",
    ),
    "fingerprints": ("fingerprint", "kind", "node_id", "detail", "first_seen"),
    "nodes": ("node_id", "slurm_name", "rack", "switch", "groups", "updated_at"),
    "findings": (
        "finding_id",
        "txn_id",
        "rule_id",
        "node_id",
        "device",
        "severity",
        "confidence",
        "level",
        "message",
        "evidence",
        "first_seen",
        "last_seen",
        "status",
        "version",
    ),
    "actions": (
        "txn_id",
        "finding_id",
        "action",
        "target",
        "status",
        "detail",
        "started_at",
        "finished_at",
        "version",
    ),
    "executors": ("host", "pid", "started_at", "beat_at", "version"),
    "evaluations": ("at", "mode", "rules", "nodes", "findings", "host"),
    "faults": (
        "fault_id",
        "node_id",
        "device",
        "kind",
        "layer",
        "impact_at",
        "source",
        "note",
        "recorded_at",
    ),
}


# ClickHouse error codes that blame the values sent: one it cannot parse, convert or hold, a NULL where
# none may be, a CHECK constraint. Anything else (TOO_MANY_PARTS, MEMORY_LIMIT_EXCEEDED, timeouts, a
# network blip, a missing table) is the store's state: the rows are fine and are tried again later.
DATA_ERROR_CODES = frozenset(
    {
        6,  # CANNOT_PARSE_TEXT
        25,  # CANNOT_PARSE_ESCAPE_SEQUENCE
        26,  # CANNOT_PARSE_QUOTED_STRING
        27,  # CANNOT_PARSE_INPUT_ASSERTION_FAILED
        38,  # CANNOT_PARSE_DATE
        41,  # CANNOT_PARSE_DATETIME
        53,  # TYPE_MISMATCH
        69,  # ARGUMENT_OUT_OF_BOUND
        70,  # CANNOT_CONVERT_TYPE
        72,  # CANNOT_PARSE_NUMBER
        117,  # INCORRECT_DATA
        131,  # TOO_LARGE_STRING_SIZE
        190,  # SIZES_OF_ARRAYS_DONT_MATCH
        321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
        349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
        407,  # DECIMAL_OVERFLOW
        469,  # VIOLATED_CONSTRAINT
    }
)
_CODE = re.compile(r"\bCode:\s*(\d+)|error code (\d+)")


def error_code(exc: Exception) -> int | None:
    """The ClickHouse error code of a clickhouse-connect (or chdb) exception, if it names one."""
    code = getattr(exc, "code", None)
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    match = _CODE.search(str(exc))
    return int(match[1] or match[2]) if match else None


def data_fault(exc: Exception) -> bool:
    """Whether `exc` blames the values sent: a data error code, or the client failing to serialise
    a value (clickhouse-connect raises ValueError, TypeError or OverflowError before sending)."""
    if isinstance(exc, ValueError | TypeError | OverflowError):
        return True
    return error_code(exc) in DATA_ERROR_CODES


def _failure(dsn: str, exc: Exception) -> StoreError:
    text = str(exc)
    if "UNKNOWN_DATABASE" in text or "UNKNOWN_TABLE" in text:
        return SchemaMissing(f"{_explain(dsn, exc)}: run `stethoscope db init` first")
    return StoreError(_explain(dsn, exc), data_fault=data_fault(exc))


def _in_use(exc: Exception) -> bool:
    text = str(exc)
    return "Unable to open the chdb engine" in text or "Cannot lock file" in text


def _explain(dsn: str, exc: Exception) -> str:
    text = str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if is_embedded(dsn):
        return f"embedded database {embedded_path(dsn)}: {redact(first)[:300]}"
    return f"ClickHouse at {redact(dsn)}: {redact(first)[:300]}"


def _config_problem(exc: Exception) -> str | None:
    """clickhouse-connect refuses a DSN option before it connects: that is the user's setting."""
    text = str(exc)
    if isinstance(exc, TypeError) and "unexpected keyword argument" in text:
        option = text.rsplit("argument", 1)[-1].strip(" '\"")
        return f"DSN option {option!r} is not a clickhouse-connect option"
    if isinstance(exc, TypeError) and "got multiple values for" in text:
        option = text.rsplit("argument", 1)[-1].strip(" '\"")
        return f"DSN gives {option!r} twice (in its address and as an option)"
    if type(exc).__name__ == "ProgrammingError" and text.startswith("Invalid value"):
        return f"DSN: {text}"
    return None


def open_wait_seconds(default: float = 30.0) -> float:
    """How long an open waits for another process to release an embedded database:
    STETHOSCOPE_OPEN_WAIT where it is set, else `default`."""
    raw = os.environ.get("STETHOSCOPE_OPEN_WAIT", "").strip()
    if not raw:
        return default
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(f"STETHOSCOPE_OPEN_WAIT={raw!r} is not a number of seconds") from None
    if seconds < 0:
        raise ConfigError(f"STETHOSCOPE_OPEN_WAIT={raw!r} must be 0 or more seconds")
    return seconds


# Every session, clustered or not (both change nothing without a Distributed table): on a cluster every
# contract name is a Distributed table, so the IN/JOIN subqueries of the rules, the ledger and the reports
# are distributed twice, which the server's default ('deny') refuses; and an insert returns only once its
# shard holds it, for the ledger, the heartbeat and the breaker read right after they write.
CLUSTER_READ_WRITE = {"distributed_product_mode": "global", "distributed_foreground_insert": 1}
# Metric rows are folded at merge time, not as each insert lands: the replacing key folds copies in
# merges, the reads that must count each sample once aggregate per (series, timestamp) or take FINAL
# (two collectors' copies are in separate inserts anyway, and the collector drops a resent sample
# before it makes rows), and the rollup views see the inserted rows either way. Folding every block
# again, and running the two rollup views one after the other, slowed the stream's inserts at 2,000
# eight-GPU nodes on 2 cores (by hand: a 66,000-row insert 1.54 -> 0.95 CPU-seconds).
METRIC_INSERT_SETTINGS = {"optimize_on_insert": 0, "parallel_view_processing": 1}
METRIC_TABLES = ("metrics", "fault_windows")


# (dsn, database) whose rollup views this process has brought to the current query: a writer reads the
# views' queries once, not on every write
_VIEWS_CHECKED: set[tuple[str, str]] = set()


class Store:
    def __init__(
        self,
        dsn: str | None = None,
        database: str | None = None,
        timeout: float = 10.0,
        open_wait: float | None = None,
    ):
        self.dsn = resolve_dsn(dsn, database)
        self.database = database_of(self.dsn)
        self.timeout = timeout
        self.open_wait = open_wait_seconds() if open_wait is None else open_wait
        self._client: Any = None
        self._holder: holder.HolderFile | None = None
        self._relay: tuple[str, str] | None = None  # (socket, who) of the serve answering through it

    # connection -------------------------------------------------------------------------------
    def open(self) -> Store:
        if self._client is not None:
            return self
        kwargs = self._client_kwargs()
        if is_embedded(self.dsn):
            self._holder = holder.HolderFile(embedded_path(self.dsn))
            problem = holder.unusable_path(embedded_path(self.dsn))
            if problem:  # the DSN names a path that cannot be a database: a setting to fix, exit 2
                raise ConfigError(f"embedded database {embedded_path(self.dsn)}: {problem}")
            outage = holder.unwritable_path(embedded_path(self.dsn))
            if outage:  # a read-only, full or vanished disk passes: writers spool and retry
                raise StoreError(f"embedded database {embedded_path(self.dsn)}: {outage}")
        deadline = time.monotonic() + self.open_wait
        announced = False
        while True:
            if self._holder is not None and self._through_relay():
                return self
            import clickhouse_connect  # here: a relayed store never loads it (a command starts sooner)

            try:
                self._client = self._connect(clickhouse_connect, kwargs)
                break
            except Exception as exc:
                problem = _config_problem(exc)
                if problem:
                    raise ConfigError(redact(problem)) from None
                if self._holder is None or not _in_use(exc):
                    raise StoreError(_explain(self.dsn, exc)) from None
                who = self._holder.describe()
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"embedded database in use by another process: {embedded_path(self.dsn)}"
                        f" (held by {who}; waited {self.open_wait:g} s, STETHOSCOPE_OPEN_WAIT)"
                    ) from None
                if not announced:
                    holder.say(
                        f"embedded database {embedded_path(self.dsn)} is held by {who}; "
                        f"waiting up to {self.open_wait:g} s for it"
                    )
                    announced = True
                self._holder.wait_released(min(1.0, max(0.0, deadline - time.monotonic())))
        if self._holder is not None:
            self._holder.claim()
        return self

    def published(self, name: str) -> Any:
        """A document the serve holding this embedded database publishes under `name` (its latest
        evaluation), asked through its relay without opening the store; None when no serve holds it,
        it publishes nothing under that name, or it cannot be asked now."""
        from stethoscope.store import relay_client

        if not is_embedded(self.dsn):
            return None
        socket_path = holder.HolderFile(embedded_path(self.dsn)).relay_socket()
        if socket_path is None:
            return None
        try:
            client = relay_client.RelayClient(socket_path, f"the serve holding {embedded_path(self.dsn)}")
        except OSError:
            return None
        try:
            text = client.published(name)
        except (StoreError, ConfigError):  # a serve from before documents were published answers none
            return None
        finally:
            client.close()
        try:
            return json.loads(text) if isinstance(text, str) else None
        except ValueError:
            return None

    def _through_relay(self) -> bool:
        """Whether serve, holding the embedded database, now answers this store's statements through its
        relay (store/relay_client.py): the holder file names its socket and the socket answers."""
        from stethoscope.store import relay_client

        assert self._holder is not None
        socket_path = self._holder.relay_socket()
        if socket_path is None:
            return False
        serve = f"embedded database {embedded_path(self.dsn)}: the relay of {self._holder.describe()}"
        try:
            self._client = relay_client.RelayClient(socket_path, serve)
        except OSError:  # serve is stopping (or gone): the path is opened directly, waiting its turn
            return False
        self._relay = (socket_path, serve)
        self._holder = None  # serve holds the path, not this process: nothing to claim or release
        return True

    def _client_kwargs(self) -> dict[str, Any]:
        # Statements name the database, so the session may start in `default`: before `db init` the
        # database does not exist.
        kwargs: dict[str, Any] = {
            "dsn": self.dsn,
            "database": "default" if is_embedded(self.dsn) else self.database,
            "settings": dict(CLUSTER_READ_WRITE),
        }
        if not is_embedded(self.dsn):
            kwargs.update(connect_timeout=self.timeout, send_receive_timeout=self.timeout)
        return kwargs

    @staticmethod
    def _connect(clickhouse_connect: Any, kwargs: dict[str, Any]) -> Any:
        try:
            return clickhouse_connect.get_client(**kwargs)
        except Exception as exc:
            if "UNKNOWN_DATABASE" not in str(exc):
                raise
            # Before `db init` the database does not exist yet; statements name it anyway.
            return clickhouse_connect.get_client(**{**kwargs, "database": "default"})

    def reader(self) -> Store:
        """Another handle on the same database, for a thread that reads beside this one: chdb serializes
        the calls on one handle, so two threads on two handles use two cores (a server's HTTP client
        gets a connection of its own). An embedded path stays claimed by this store; close the reader
        first. The reader is a plain Store: a subclass's own `query` does not see its queries."""
        self.open()
        other = Store(self.dsn, timeout=self.timeout, open_wait=0)
        try:
            if self._relay is not None:  # a connection of its own: serve answers it on another thread
                from stethoscope.store import relay_client

                other._client, other._relay = relay_client.RelayClient(*self._relay), self._relay
            else:
                import clickhouse_connect

                other._client = self._connect(clickhouse_connect, self._client_kwargs())
        except OSError as exc:
            raise StoreError(f"{self._relay[1] if self._relay else self.dsn}: {exc}") from None
        except Exception as exc:
            raise _failure(self.dsn, exc) from None
        return other

    def close(self) -> None:
        client, self._client, self._relay = self._client, None, None
        if client is not None:
            try:
                client.close()
            except Exception as exc:  # closing must not hide the result of the work done
                logging.getLogger(__name__).warning("closing %s: %s", redact(self.dsn), redact(exc))
            if self._holder is not None:
                self._holder.release()

    def __enter__(self) -> Store:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def client(self) -> Any:
        if self._client is None:
            self.open()
        return self._client

    def answers(self) -> bool:
        """Whether the store answers at all: what tells a failed statement from a failed store."""
        try:
            self.query("SELECT 1")
        except StoreError:
            return False
        return True

    # schema -----------------------------------------------------------------------------------
    def ensure_schema(self) -> None:
        """Create the schema unless the metrics table is already there (writers call this), the
        tables added since on a database from before them (`evaluations`, `silences`), and bring its
        rollup views to the current query (once a process: see upgrade_views)."""
        exists = self.query(
            "SELECT count() FROM system.tables WHERE database = {db:String} "
            "AND name IN ('metrics', 'evaluations', 'silences')",
            {"db": self.database},
        )
        if not exists or exists[0][0] < 3:
            self.init_schema()
        elif (self.dsn, self.database) not in _VIEWS_CHECKED:
            self.upgrade_views(strict=False)

    def upgrade_views(self, strict: bool = True) -> list[str]:
        """Give each rollup view of the older query (schema.OLDER_VIEW_MARK) the current one in place
        (ALTER ... MODIFY QUERY: no insert meanwhile goes uncounted); the statements run. A cluster's
        views (on `metrics_local`, changed ON CLUSTER) are left as they are: docs/design.md "Storage"
        gives the statement. Not `strict` (a writer's check), a refusal (no ALTER grant, an older
        server) is a warning: the older view stores the same rows, at a slower insert."""
        rows = self.query(
            "SELECT name, engine, as_select FROM system.tables "
            "WHERE database = {db:String} AND has({names:Array(String)}, name)",
            {"db": self.database, "names": ["metrics", *VIEW_SELECTS]},
        )
        clustered = any(name == "metrics" and engine == "Distributed" for name, engine, _ in rows)
        older = [name for name, _, select in rows if name in VIEW_SELECTS and OLDER_VIEW_MARK in select]
        statements = [
            f"ALTER TABLE {self.database}.{view} MODIFY QUERY "
            + VIEW_SELECTS[view].format(db=self.database, source="metrics")
            for view in ([] if clustered else older)
        ]
        try:
            for statement in statements:
                self.command(statement)
        except StoreError as exc:
            if strict:
                raise
            logging.getLogger(__name__).warning(
                "%s: the rollup views keep their older query (the same rows, a slower insert): %s",
                redact(self.dsn),
                exc,
            )
        _VIEWS_CHECKED.add((self.dsn, self.database))
        return statements

    def init_schema(self, raw_ttl_days: int = DEFAULT_RAW_TTL_DAYS) -> list[str]:
        before = self._tables()
        statements = single_node_ddl(self.database, raw_ttl_days)
        for statement in statements:
            self.command(statement)
        if "metrics" in before and "metrics_hourly" not in before:
            # an existing database gets the hourly rollup of what its raw rows still hold; the view
            # exists first, so a row written meanwhile is counted twice rather than lost
            statements.append(hourly_backfill(self.database))
            self.command(statements[-1])
        statements.extend(self.upgrade_views())
        return statements

    def _tables(self) -> set[str]:
        sql = "SELECT name FROM system.tables WHERE database = {db:String}"
        rows = self.query(sql, {"db": self.database})
        return {row[0] for row in rows}

    def check_cluster_ddl(self, cluster: str = "{cluster}") -> list[str]:
        """Parse the cluster variant with ClickHouse's own parser (formatQuery); nothing is created."""
        statements = cluster_ddl(self.database, cluster)
        for statement in statements:
            self.query("SELECT formatQuery({sql:String})", {"sql": statement})
        return statements

    # statements -------------------------------------------------------------------------------
    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        try:
            return self.client.command(sql, parameters=parameters)
        except StoreError:
            raise
        except Exception as exc:
            raise _failure(self.dsn, exc) from None

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> list[tuple]:
        try:
            return self.client.query(sql, parameters=parameters).result_rows
        except StoreError:
            raise
        except Exception as exc:
            raise _failure(self.dsn, exc) from None

    def query_arrow(
        self, sql: str, parameters: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
    ) -> Any:
        """The result as a pyarrow Table (chdb's dependency): millions of rows without Python objects."""
        try:
            return self.client.query_arrow(sql, parameters=parameters, settings=settings)
        except StoreError:
            raise
        except Exception as exc:
            raise _failure(self.dsn, exc) from None

    def _insert(self, table: str, columns: Sequence[Sequence[Any]], names: Sequence[str]) -> None:
        self.insert_columns(f"{self.database}.{table}", columns, names)

    def insert_columns(self, table: str, columns: Sequence[Sequence[Any]], names: Sequence[str]) -> None:
        """Columns into `table`, named with its database (`db.table`): the relay's insert (serve/relay.py).
        Metric tables take METRIC_INSERT_SETTINGS where the insert runs (here, or in the relay's serve)."""
        # through the relay, serve's own insert_columns applies them
        tuned = {"settings": METRIC_INSERT_SETTINGS} if self._relay is None and _metric_table(table) else {}
        try:
            self.client.insert(table, list(columns), column_names=list(names), column_oriented=True, **tuned)
        except StoreError:
            raise
        except Exception as exc:
            raise _failure(self.dsn, exc) from None

    # writes -----------------------------------------------------------------------------------
    def insert_metrics(self, metrics: MetricColumns, table: str = "metrics") -> int:
        """Metric rows into `metrics`, or into `fault_windows` (the same columns: a fault's kept rows)."""
        if table not in METRIC_TABLES:
            raise ValueError(f"{table}: not a table of metric rows")
        if len(metrics):
            self._insert(table, metrics.columns(), METRIC_COLUMNS)
        return len(metrics)

    def insert_rows(self, table: str, rows: list[dict[str, Any]]) -> int:
        if not rows:
            return 0
        names = ROW_TABLES[table]
        self._insert(table, [[row[name] for row in rows] for name in names], names)
        return len(rows)

    def write_batch(self, batch: Batch) -> int:
        written = self.insert_metrics(batch.metrics)
        written += self.insert_rows("facts", batch.facts)
        written += self.insert_rows("bench_results", batch.bench)
        written += self.insert_rows("fingerprints", batch.fingerprints)
        written += self.insert_rows("nodes", batch.nodes)
        return written


def formatted_sql(sql: str) -> str:
    """`sql` as ClickHouse itself formats it (formatQuery), by an embedded session of its own on a
    temporary folder removed afterwards: no store is read, none is created."""
    with (
        tempfile.TemporaryDirectory(prefix="stethoscope-format-") as scratch,
        Store(f"chdb://{scratch}/db", open_wait=0) as session,
    ):
        return str(session.query("SELECT formatQuery({sql:String})", {"sql": sql})[0][0])


def _metric_table(table: str) -> bool:
    return table.rpartition(".")[2] in METRIC_TABLES
