"""Rule evaluation in ClickHouse: one query per rule over all nodes (docs/design.md "Rules"); a cycle
(`evaluate_all`) reads a family of rules that share their read in one (shared_reads.py), and judges
the plain rules in Python from one read per window of every metric they name (window_reads.py,
`QueryBuilder.window_read`), as their own queries would.

A condition becomes a subquery that aggregates a metric per node, device and label set over its
window and keeps the rows past the threshold; `all` joins its members on the node (and on the
enclosing device where every member names the same kind of device, from the catalog's `device_kinds`:
gpu2/link3 belongs to gpu2), `any` unions them. Benchmark metrics are read from `bench_results`;
windows longer than the raw TTL (the store's own, read once per `evaluate_all`) read the
`metrics_daily` rollup (one sample a day, its last value) for the days before the evaluation time's
own, whose raw rows are read up to it (for `last`, `max` and `min` without `min_samples` or a
baseline, its whole hours from `metrics_hourly` instead, one row an hour: the same answer, where that
rollup keeps what the raw rows keep).
Samples are read once per (series, timestamp), however often a row was replayed. `aggregate: any`
compares each sample of the window on its own (a state bit that comes and goes between evaluations is
still seen): the series matches when `min_matches` samples pass, its value is the bits those samples
held together (has_bits) or the worst of them, and its values say how often (MATCHES of SAMPLES).
Increases (delta,
rate) run from the last sample at or before the window's start (2 days of raw rows, then the daily
rollup; else the first sample inside, or 0 for an `events` metric: its first event is news) to the
last sample inside, a drop counting as a counter reset; whole hours come from metrics_hourly where it
gives the raw rows' own answer (`hourly_increase`). Of the conditions `all` joins, the costliest is read
last, only if the others match. A baseline condition compares the window's
aggregate with the node's own earlier history (its median for a percent deviation, its mean and σ
for sigma) or with the fleet's median, and its value is the
deviation in the direction the catalog calls worse. A rule with `correlate` also returns, per match,
how many matching nodes share its switch (or rack), so several nodes behind one switch become one
finding about the switch. A cycle's rules are read by a few connections at once (`evaluate_all`,
STETHOSCOPE_READERS), their matches returned in the rules' order; a rule whose query fails while the
store answers costs that rule only (a RuleFailure beside the others' matches).
"""

from __future__ import annotations

import contextvars
import logging
import math
import os
import queue
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from stethoscope.aggregates import INCREASES, REGISTRY
from stethoscope.catalog import Catalog, default_catalog
from stethoscope.diagnosis.rules import Condition, Group, Rule
from stethoscope.diagnosis.shared_reads import LOWER_IS_WORSE, device_regex, sole_condition, units, worst
from stethoscope.diagnosis.spans import spans
from stethoscope.diagnosis.window_reads import (
    NotJudged,
    ReadKey,
    Series,
    WindowRead,
    judge,
    labels_of,
    plain_rule,
    read_key,
    window_reads,
)
from stethoscope.store.client import SchemaMissing, Store, StoreError
from stethoscope.store.dsn import ConfigError, is_embedded
from stethoscope.store.schema import DEFAULT_RAW_TTL_DAYS, HOURLY_TTL_DAYS
from stethoscope.store.ttl import raw_ttl_seconds as stored_raw_ttl_seconds

log = logging.getLogger(__name__)
_OPERATORS = {">": ">", ">=": ">=", "<": "<", "<=": "<=", "==": "=", "!=": "!="}
# How far back the raw rows are searched for the sample an increase starts from (first the last hour,
# then for the series without one up to 2 days); the daily rollup after.
NEAR_LOOKBACK_SECONDS = 3600
LOOKBACK_SECONDS = 2 * 86400
# A fleet of identical recordings has a MAD of 0; the spread is floored at this fraction of the median.
_MIN_RELATIVE_SPREAD = 0.001
_MAD_TO_SIGMA = 1.4826
QUERY, AGGREGATE, MESSAGE = "query", "aggregate", "message"  # RuleFailure.stage
NONFINITE_SHOWN = 10  # series named in the failure of a rule whose aggregates overflowed
# the keys of a match's values that say how often an `any` condition held: `<metric>.matches` of
# `<metric>.samples` in the window
MATCHES, SAMPLES = ".matches", ".samples"


@dataclass(frozen=True)
class RuleFailure:
    """A rule whose evaluation failed while the store answered: its own fault (or its data's)."""

    rule_id: str
    where: str  # the rule's file:line
    error: str
    # what failed: its query (nothing of the rule was read), or part of what it read: the
    # aggregates of some series (AGGREGATE), the rendering of a finding's message (MESSAGE)
    stage: str = "query"


@dataclass
class Evaluation:
    matches: list[list[Match]]  # per rule, in the rules' order; [] for a rule whose query failed
    failures: list[RuleFailure] = field(default_factory=list)  # in the rules' order


@dataclass
class Match:
    node_id: str
    device: str
    value: float
    values: dict[str, float] = field(default_factory=dict)
    nodes: list[str] = field(default_factory=list)  # a correlated finding: the nodes behind it


# The threads a query of a cycle may use (SETTINGS max_threads), where several read at once; None:
# ClickHouse's own default. Set per reading thread by `_read_all`.
QUERY_THREADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("query_threads", default=None)
_MARK = "\x00"  # around the number of a read (QueryBuilder.read) until the statement is made


class QueryBuilder:
    """Builds the SQL of one rule; values travel as query parameters, never spliced in."""

    # How raw rows are read once per (series, timestamp): GROUP BY, as exact as FINAL and several times
    # cheaper while parts await their merge (benchmarks/dedup_reads.py measures both).
    dedup = "group_by"  # group_by | final

    def __init__(
        self,
        database: str,
        at_ms: int,
        raw_ttl_seconds: int,
        nodes: Sequence[str] | None = None,
        rollup: bool = True,
        any_labels: Sequence[tuple[tuple[str, str], ...]] = (),
    ):
        self.database = database
        # a family's read (shared_reads.py): the series of any of these label sets, where each has some
        self.any_labels = any_labels if all(any_labels) else ()
        self.raw_ttl_seconds = raw_ttl_seconds
        self.rollup = rollup  # whether metrics_hourly may stand in for whole hours of raw rows
        self.params: dict[str, Any] = {"at": at_ms}
        self.count = 0
        self._named: dict[tuple[str, str, Any], str] = {}  # one parameter per value and type, reused
        self._reads: dict[str, str] = {}  # a read of stored rows -> the mark standing for it (`read`)
        self.nodes = nodes is not None
        if nodes is not None:
            self.params["nodes"] = sorted(nodes)
        self.batch: WindowRead | None = None  # set by window_read: the read is of several metrics
        self.series = "node_id, device, labels_key"  # the columns a series is known by

    def batched(self, read: WindowRead) -> None:
        """Read `read`'s metrics together from here on: a series is known by its metric too."""
        self.batch = read
        self.params["metrics"] = list(read.metrics)
        if read.events:
            self.params["events"] = list(read.events)
        self.series = "metric_name, node_id, device, labels_key"

    def param(self, value: Any, kind: str) -> str:
        key = (kind, type(value).__name__, value)
        if key not in self._named:
            self.count += 1
            self._named[key] = name = f"p{self.count}"
            self.params[name] = value
        return f"{{{self._named[key]}:{kind}}}"

    def read(self, sql: str) -> str:
        """Where a query reads the rows `sql` selects from the store (FROM, IN): a mark that `statement`
        makes `(sql)`, or a name its WITH gives `sql` once where several conditions read the same rows."""
        if _MARK in sql:  # a read inside a read would leave its mark in the statement
            raise ValueError("a read is of stored rows, not of other reads")
        return self._reads.setdefault(sql, f"{_MARK}{len(self._reads) + 1}{_MARK}")

    def statement(self, body: str) -> tuple[str, dict[str, Any]]:
        """The query `body` as it runs, its reads resolved (`read`), and the parameters it uses."""
        named: list[str] = []
        for sql, mark in self._reads.items():
            if body.count(mark) > 1:
                name = f"rows{len(named) + 1}"
                named.append(f"{name} AS ({sql})")
                body = body.replace(mark, name)
            else:
                body = body.replace(mark, f"({sql})")
        if named:
            body = f"WITH {', '.join(named)} {body}"
        threads = QUERY_THREADS.get()
        if threads is not None:
            body = f"{body} SETTINGS max_threads = {int(threads)}"
        # a parameter made for a part the query does not take (a window's start, where whole hours
        # are read instead) is left out, so that those shown are the ones it reads
        return body, {name: value for name, value in self.params.items() if f"{{{name}:" in body}

    def aggregate(self, condition: Condition) -> str:
        return REGISTRY[condition.aggregate].sql

    def filters(self, condition: Condition) -> list[str]:
        if self.batch is not None:  # a window's read of several metrics: each condition judges its series
            where = ["metric_name IN {metrics:Array(String)}"]
            if self.nodes:
                where.append("node_id IN {nodes:Array(String)}")
            return where
        where = [f"metric_name = {self.param(condition.metric, 'String')}"]
        if self.nodes:  # only the inventory's hosts (their peers too, for a fleet baseline): a set, which
            # has() is not (it scans the array on every row: minutes a cycle at 2,000 nodes)
            where.append("node_id IN {nodes:Array(String)}")
        if condition.labels:
            where.append(self.labelled(condition.labels))
        if self.any_labels:
            where.append("(" + " OR ".join(f"({self.labelled(labels)})" for labels in self.any_labels) + ")")
        if condition.device:
            where.append(f"match(device, {self.param(device_regex(condition.device), 'String')})")
        return where

    def labelled(self, labels: tuple[tuple[str, str], ...], column: str = "labels") -> str:
        """Whether the map `column` holds every (key, value) of `labels`."""
        pairs = ((self.param(key, "String"), self.param(value, "String")) for key, value in labels)
        return " AND ".join(f"{column}[{key}] = {value}" for key, value in pairs)

    def daily(self, condition: Condition) -> bool:
        """Whether the condition reaches past the raw TTL, so reads the daily rollup."""
        reach = condition.window_seconds + condition.history_seconds * (condition.baseline == "node")
        return reach > self.raw_ttl_seconds

    def source(self, condition: Condition, start: str, end: str) -> str:
        """Rows (node_id, device, labels_key, value, timestamp, cls) of the metric in (start, end],
        one per (series, timestamp) however often a row was stored."""
        where = [*self.filters(condition), f"timestamp <= {end}", f"timestamp > {start}"]
        if condition.metric.startswith("bench_"):
            return (
                "SELECT node_id, device, labels_key, value, timestamp, class_fingerprint AS cls "
                f"FROM {self.database}.bench_results FINAL WHERE {' AND '.join(where)}"
            )
        if self.daily(condition):
            return self.daily_source(condition, start, end)
        return self.raw_source(where)

    def raw_source(self, where: list[str]) -> str:
        if self.dedup == "final":
            return (
                "SELECT node_id, device, labels_key, value, timestamp, '' AS cls "
                f"FROM {self.database}.metrics FINAL WHERE {' AND '.join(where)}"
            )
        return (
            "SELECT node_id, device, labels_key, any(value) AS value, timestamp, '' AS cls "
            f"FROM {self.database}.metrics WHERE {' AND '.join(where)} "
            "GROUP BY node_id, device, labels_key, timestamp"
        )

    def window_read(self, read: WindowRead) -> str:
        """(metric_name, node_id, device, labels_key, n, a_<aggregate>..., b_<aggregate>...) of the
        series of `read`'s metrics over its window (window_reads.py) that pass at least one of its
        conditions' sample count and comparison (their labels and devices are judged after): each
        aggregate it names, and as bits those its has_bits conditions compare. A series' labels are
        read from its labels_key (window_reads.labels_of), not from the labels column."""
        self.batched(read)
        seconds = self.param(read.window_seconds, "UInt32")
        if read.increases:  # a condition's delta or rate: as QueryBuilder.increase reads them
            condition = read.increase()
            increase = self.hourly_increase(condition, self.deep(condition))
            increases = {"delta": "cur", "rate": f"cur / {seconds}"}
            columns = [f"{increases[name]} AS a_{name}" for name in read.aggregates]
            columns += [f"{_bits(f'a_{name}')} AS b_{name}" for name in read.bits]
            return self.passing(
                read,
                f"SELECT metric_name, node_id, device, labels_key, n, {', '.join(columns)} FROM ({increase})",
            )
        end = "fromUnixTimestamp64Milli({at:Int64}, 'UTC')"
        where = [
            *self.filters(Condition("", ">", 0, 0)),
            f"timestamp <= {end}",
            f"timestamp > {end} - toIntervalSecond({seconds})",
        ]
        series = self.series
        if self.dedup == "final":
            rows = (
                f"SELECT {series}, value, timestamp "
                f"FROM {self.database}.metrics FINAL WHERE {' AND '.join(where)}"
            )
        else:
            rows = (
                f"SELECT {series}, any(value) AS value, timestamp FROM {self.database}.metrics "
                f"WHERE {' AND '.join(where)} GROUP BY {series}, timestamp"
            )
        columns = [f"{REGISTRY[name].sql} AS a_{name}" for name in read.aggregates]
        columns += [f"{_bits(f'a_{name}')} AS b_{name}" for name in read.bits]
        return self.passing(
            read,
            f"SELECT metric_name, node_id, device, labels_key, "
            f"count() AS n, {', '.join(columns)} FROM ({rows}) GROUP BY {series}",
        )

    def passing(self, read: WindowRead, series: str) -> str:
        """The rows of `series` that pass a condition of `read` on their metric, its labels and device
        aside: a healthy fleet's series stay in ClickHouse, and a rule is judged from those it needs."""
        tests = [
            f"(metric_name = {self.param(c.metric, 'String')} AND n >= {self.param(c.min_samples, 'UInt32')} "
            f"AND {self.comparison(c, f'a_{c.aggregate}')})"
            for c in read.conditions
        ]
        return f"SELECT * FROM ({series}) WHERE {' OR '.join(tests)}"

    def daily_source(self, condition: Condition, start: str, end: str) -> str:
        """`source` past the raw TTL: one row a day from metrics_daily for the days that ended by
        `end`, then the rows of the day `end` falls in, up to `end` (the rollup's row for that day holds
        the whole day, so at a past instant, `diagnose --at` or the audit, it would read what came after
        it): its raw rows, or, where that gives the raw rows' own answer (`hours_answer`), its whole
        hours from metrics_hourly and the raw rows after them."""
        day_value = {"max": "max(max_value)", "min": "min(min_value)"}.get(
            condition.aggregate, "argMaxMerge(last_value)"
        )
        day_start = "toDateTime64(day, 3, 'UTC')"
        daily_where = [*self.filters(condition), f"{day_start} > {start}", f"day < toDate({end}, 'UTC')"]
        midnight = f"toDateTime64(toDate({end}, 'UTC'), 3, 'UTC')"
        days = (
            f"SELECT node_id, device, labels_key, {day_value} AS value, {day_start} AS timestamp, '' AS cls "
            f"FROM {self.database}.metrics_daily WHERE {' AND '.join(daily_where)} "
            "GROUP BY node_id, device, labels_key, day"
        )
        if not self.hours_answer(condition):
            today = [*self.filters(condition), f"timestamp >= {midnight}", f"timestamp > {start}"]
            return f"{days} UNION ALL {self.raw_source([*today, f'timestamp <= {end}'])}"
        # the day's reach, (midnight - 1 ms, at], split as an increase's is (spans.py): its whole hours,
        # then the raw rows after the last of them (a window past the raw TTL starts days before)
        at = self.params["at"]
        before_midnight = at - at % 86_400_000 - 1
        day = spans(before_midnight, before_midnight, at)
        (first, last), (_, tail) = day.inside, day.raw[2]
        hourly_where = [*self.filters(condition), self.between(first, last)]
        hours = (
            f"SELECT node_id, device, labels_key, {day_value} AS value, max(last_at) AS timestamp, '' AS cls "
            f"FROM {self.database}.metrics_hourly WHERE {' AND '.join(hourly_where)} "
            "GROUP BY node_id, device, labels_key, hour"
        )
        raw = self.raw_source([*self.filters(condition), self.between(last, tail, "timestamp")])
        return f"{days} UNION ALL {hours} UNION ALL {raw}"

    def instant(self, t: int) -> str:
        """The epoch millisecond `t` as a query parameter, a DateTime64."""
        return f"fromUnixTimestamp64Milli({self.param(t, 'Int64')}, 'UTC')"

    def between(self, first: int, last: int, column: str = "hour") -> str:
        """`column` in [first, last), epoch milliseconds."""
        return f"{column} >= {self.instant(first)} AND {column} < {self.instant(last)}"

    def hourly_keeps(self) -> bool:
        """Whether metrics_hourly may stand in for raw rows: it is read (`rollup`) and its fixed TTL
        keeps every hour the raw TTL keeps (`db init --ttl-days 120` keeps raw rows longer)."""
        return self.rollup and self.raw_ttl_seconds <= HOURLY_TTL_DAYS * 86400

    def hours_answer(self, condition: Condition) -> bool:
        """Whether an hour's one row from metrics_hourly (its last value at its last sample, its max or
        its min) answers for the hour as its raw rows would: for `last`, `max` and `min` without a count
        of samples, where the rollup keeps what the raw rows keep (`hourly_keeps`). Another aggregate
        (an average, each sample of `any`, a counter's resets inside an hour) needs every raw row."""
        return (
            self.hourly_keeps()
            and condition.aggregate in ("last", "max", "min")
            and condition.min_samples <= 1
            and condition.baseline is None
        )

    def increase(self, condition: Condition, start: str, end: str) -> str:
        """(node_id, device, labels_key, cls, cur, n) for delta and rate: the increase from the last
        sample at or before `start` to the last inside, a drop counting its new value (a reset).

        The sample before is looked for in the hour before the window; only for the series without
        one (new, or after a gap), in the raw rows up to 2 days back, then in the daily rollup: a
        series' rows are sorted by time, so the narrow reads touch few granules."""
        filters = self.filters(condition)
        near, deep = max(condition.window_seconds, NEAR_LOOKBACK_SECONDS), self.deep(condition)
        if self.hourly_reads(condition, deep):
            return self.hourly_increase(condition, deep)
        if self.daily(condition):
            rows = self.source(condition, f"{start} - toIntervalSecond({near})", end)
        else:  # a replayed row adds a step of 0 here, so the raw rows need no FINAL
            where = [*filters, f"timestamp <= {end}", f"timestamp > {start} - toIntervalSecond({near})"]
            rows = (
                "SELECT node_id, device, labels_key, value, timestamp "
                f"FROM {self.database}.metrics WHERE {' AND '.join(where)}"
            )
        inside = f"timestamp > {start}"
        samples = (
            "SELECT node_id, device, labels_key, "
            f"arrayMap(t -> t.2, arraySort(groupArrayIf((timestamp, value), {inside}))) AS inside, "
            f"uniqExactIf(timestamp, {inside}) AS n, argMaxIf(value, timestamp, NOT ({inside})) AS before, "
            f"countIf(NOT ({inside})) > 0 AS has_before "
            f"FROM {self.read(rows)} GROUP BY node_id, device, labels_key HAVING n > 0"
        )
        stale = "(node_id, device, labels_key) IN stale"
        older_where = [
            *filters,
            stale,
            f"timestamp <= {start} - toIntervalSecond({near})",
            f"timestamp > {start} - toIntervalSecond({deep})",
        ]
        older = (
            "SELECT node_id, device, labels_key, argMax(value, timestamp) AS last, 1 AS found "
            f"FROM {self.database}.metrics WHERE {' AND '.join(older_where)} "
            "GROUP BY node_id, device, labels_key"
        )
        daily_where = [*filters, stale, f"day <= toDate({start} - toIntervalSecond({deep}))"]
        daily = (
            "SELECT node_id, device, labels_key, argMaxMerge(last_value) AS last, 1 AS found "
            f"FROM {self.database}.metrics_daily WHERE {' AND '.join(daily_where)} "
            "GROUP BY node_id, device, labels_key"
        )
        joins = (
            f"LEFT JOIN ({older}) AS o USING (node_id, device, labels_key) "
            f"LEFT JOIN ({daily}) AS d USING (node_id, device, labels_key)"
        )
        fallback = "if(o.found = 1, o.last, if(d.found = 1, d.last, {fresh}))"
        # the series without a sample before the window: named once, for both looks further back
        stale_series = "SELECT node_id, device, labels_key FROM samples WHERE NOT has_before"
        named = {"samples": samples, "stale": stale_series}
        return self.folded(condition, named, fallback, joins)

    def folded(self, condition: Condition, named: dict[str, str], fallback: str, joins: str) -> str:
        """The increase over each series' row of `named["samples"]` (`named`: the queries the WITH
        names, for `joins` to read), from the sample before the window (else `fallback`, where `{fresh}`
        stands for the series' first value, or 0 for events: news)."""
        fresh = "0" if condition.kind == "events" else "s.inside[1]"
        if self.batch is not None and self.batch.events:  # of the metrics read, those that are events
            fresh = "if(s.metric_name IN {events:Array(String)}, 0, s.inside[1])"
        base = f"if(s.has_before, s.before, {fallback.format(fresh=fresh)})"
        steps = f"arrayPushFront(s.inside, {base})"
        pairs = f"arrayPopBack({steps}), arrayPopFront({steps})"
        increase = f"arraySum(arrayMap((a, b) -> if(b >= a, b - a, b), {pairs}))"
        if condition.aggregate == "rate":
            increase = f"{increase} / {self.param(condition.window_seconds, 'UInt32')}"
        ctes = ", ".join(f"{name} AS ({sql})" for name, sql in named.items())
        metric = "s.metric_name AS metric_name, " if self.batch is not None else ""
        return (
            f"WITH {ctes} "
            f"SELECT {metric}s.node_id AS node_id, s.device AS device, s.labels_key AS labels_key, "
            "'' AS cls, "
            f"{increase} AS cur, s.n AS n FROM samples AS s {joins}"
        )

    @staticmethod
    def deep(condition: Condition) -> int:
        """How far before the window an increase looks for the sample it starts from."""
        return max(condition.window_seconds, NEAR_LOOKBACK_SECONDS, LOOKBACK_SECONDS)

    def hourly_reads(self, condition: Condition, deep: int) -> bool:
        """Whether the increase may read whole hours from metrics_hourly: its reach stays within the
        raw TTL (else the raw rows would have expired where the rollup still answers) and the rollup
        keeps what the raw rows keep (`hourly_keeps`), and it counts samples only to see that there
        are some (the rollup may count a replayed row twice)."""
        reach = condition.window_seconds + deep
        return (
            self.hourly_keeps()
            and not self.daily(condition)
            and not condition.metric.startswith("bench_")
            and condition.min_samples <= 1
            and reach <= self.raw_ttl_seconds
        )

    def hourly_increase(self, condition: Condition, deep: int) -> str:
        """The increase as `increase` computes it from the raw rows, with the whole hours read from
        metrics_hourly: before the window the last sample of each (all the start of an increase
        needs), inside it one sample for an hour that holds one value (its steps are 0), and the raw
        rows of an hour that moves (a reset inside it cannot be told from its min, max and last). The
        raw rows of the partial hours complete it, so the answer equals the raw rows' own."""
        at = self.params["at"]
        start = at - condition.window_seconds * 1000
        reach = spans(start - deep * 1000, start, at)
        db, series = self.database, self.series

        ms, hours = self.instant, self.between

        (b0, b1), (i0, i1) = reach.before, reach.inside
        moving = (
            f"SELECT {series}, hour FROM {db}.metrics_hourly "
            f"WHERE {' AND '.join([*self.filters(condition), hours(i0, i1)])} "
            f"GROUP BY {series}, hour HAVING min(min_value) < max(max_value)"
        )
        stretches = " OR ".join(f"({hours(lo, hi, 'timestamp')})" for lo, hi in reach.raw if lo < hi)
        # apart: the moving hours' set then selects their granules alone, and the partial hours'
        # rows (of every series) are not each looked up in it
        raw = " UNION ALL ".join(
            f"SELECT {series}, value, timestamp FROM {db}.metrics WHERE {' AND '.join(where)}"
            for where in (
                [*self.filters(condition), f"({stretches or 'false'})"],
                [
                    *self.filters(condition),
                    hours(i0, i1, "timestamp"),
                    f"({series}, toStartOfHour(timestamp)) IN {self.read(moving)}",
                ],
            )
        )
        # an hour before the window stands for its last sample, a still hour inside for its value
        rolled = (
            f"SELECT {series}, if(hour < {ms(b1)}, argMaxMerge(last_value), min(min_value)) AS value, "
            f"max(last_at) AS timestamp FROM {db}.metrics_hourly "
            f"WHERE {' AND '.join([*self.filters(condition), f'(({hours(b0, b1)}) OR ({hours(i0, i1)}))'])} "
            f"GROUP BY {series}, hour HAVING hour < {ms(b1)} OR min(min_value) = max(max_value)"
        )
        inside = f"timestamp > {ms(start)}"
        samples = (
            f"SELECT {series}, "
            f"arrayMap(t -> t.2, arraySort(groupArrayIf((timestamp, value), {inside}))) AS inside, "
            f"countIf({inside}) AS n, argMaxIf(value, timestamp, NOT ({inside})) AS before, "
            f"countIf(NOT ({inside})) > 0 AS has_before "
            f"FROM ({raw} UNION ALL {rolled}) GROUP BY {series} HAVING n > 0"
        )
        daily_where = [*self.filters(condition), f"day <= toDate({ms(reach.lookback)})"]
        daily = (
            f"SELECT {series}, argMaxMerge(last_value) AS last, 1 AS found "
            f"FROM {db}.metrics_daily WHERE {' AND '.join(daily_where)} GROUP BY {series}"
        )
        joins = f"LEFT JOIN ({daily}) AS d USING ({series})"
        return self.folded(condition, {"samples": samples}, "if(d.found = 1, d.last, {fresh})", joins)

    def window(self, condition: Condition) -> tuple[str, str]:
        end = "fromUnixTimestamp64Milli({at:Int64}, 'UTC')"
        return f"{end} - toIntervalSecond({self.param(condition.window_seconds, 'UInt32')})", end

    def comparison(self, condition: Condition, x: str = "x") -> str:
        """Whether `x` (the window's aggregate, or one sample's value for `any`) passes."""
        if condition.operator == "has_bits":
            bits = _bits(x)
            passes = f"bitAnd({bits}, {self.param(int(condition.threshold), 'UInt64')}) != 0"
            if condition.without_bits:
                passes += f" AND bitAnd({bits}, {self.param(condition.without_bits, 'UInt64')}) = 0"
            return passes
        return f"{x} {_OPERATORS[condition.operator]} {self.param(condition.threshold, 'Float64')}"

    def any_sample(self, condition: Condition, start: str, end: str) -> str:
        """(node_id, device, labels_key, cls, cur, n, m) for `any`: m of the n samples pass on their own;
        cur is the bits they hold together (has_bits), else the worst of them as the operator reads worst."""
        passes = self.comparison(condition, "value")
        if condition.operator == "has_bits":
            cur = f"toFloat64(groupBitOrIf({_bits('value')}, {passes}))"
        elif condition.operator in (">", ">="):
            cur = f"maxIf(value, {passes})"
        elif condition.operator in ("<", "<="):
            cur = f"minIf(value, {passes})"
        else:
            cur = f"argMaxIf(value, timestamp, {passes})"
        return (
            f"SELECT node_id, device, labels_key, any(cls) AS cls, {cur} AS cur, count() AS n, "
            f"countIf({passes}) AS m FROM {self.read(self.source(condition, start, end))} "
            "GROUP BY node_id, device, labels_key"
        )

    def measured(self, condition: Condition) -> str:
        """(node_id, device, labels_key, cls, x, n): the condition's value per series, before comparing."""
        start, end = self.window(condition)
        if condition.aggregate == "any":  # no baseline: the loader refuses one
            counted = self.any_sample(condition, start, end)
            return f"SELECT node_id, device, labels_key, cls, cur AS x, n, m FROM ({counted})"
        if condition.aggregate in INCREASES:
            current = self.increase(condition, start, end)
        else:
            current = (
                f"SELECT node_id, device, labels_key, any(cls) AS cls, {self.aggregate(condition)} AS cur, "
                f"count() AS n FROM {self.read(self.source(condition, start, end))} "
                "GROUP BY node_id, device, labels_key"
            )
        if condition.baseline is None:
            return f"SELECT node_id, device, labels_key, cls, cur AS x, n FROM ({current})"
        worse = {"lower": "1", "higher": "-1"}.get(condition.better)
        signed = f"{worse} * (cur - base)" if worse else "abs(cur - base)"
        if condition.baseline == "node":
            base = "quantileExact(0.5)(value)" if condition.deviation == "percent" else "avg(value)"
            history_start = f"{start} - toIntervalSecond({self.param(condition.history_seconds, 'UInt32')})"
            history = (
                # percent: from the median (a few slow warm-up steps do not lift it); sigma: mean and σ
                f"SELECT node_id, device, labels_key, {base} AS base, stddevSamp(value) AS spread, "
                f"count() AS hn FROM {self.read(self.source(condition, history_start, start))} "
                "GROUP BY node_id, device, labels_key HAVING hn >= 3"
            )
            joined = (
                f"SELECT c.*, h.base AS base, h.spread AS spread FROM ({current}) AS c "
                f"INNER JOIN ({history}) AS h USING (node_id, device, labels_key)"
            )
        else:
            median = (
                "SELECT *, quantileExact(0.5)(cur) OVER (PARTITION BY device, labels_key, cls) AS base, "
                "count() OVER (PARTITION BY device, labels_key, cls) AS peers "
                f"FROM ({current})"
            )
            joined = (
                "SELECT *, quantileExact(0.5)(abs(cur - base)) OVER (PARTITION BY device, labels_key, cls) "
                f"* {_MAD_TO_SIGMA} AS spread FROM ({median}) WHERE peers >= 3"
            )
        if condition.deviation == "percent":
            scale = "(greatest(abs(base), 1e-12) / 100)"
        else:
            scale = f"greatest(spread, abs(base) * {_MIN_RELATIVE_SPREAD}, 1e-12)"
        return f"SELECT node_id, device, labels_key, cls, {signed} / {scale} AS x, n FROM ({joined})"

    def enclosing_key(self, enclosing: str | None) -> str:
        """The part of the device name the enclosing kind's pattern matches, else the whole name."""
        if enclosing is None:
            return "''"
        pattern = self.param(f"^({enclosing})", "String")
        return f"if(extract(device, {pattern}) = '', device, extract(device, {pattern}))"

    def leaf(self, condition: Condition, enclosing: str | None) -> str:
        key = self.enclosing_key(enclosing)
        # the worst series of the node (or enclosing device) speaks for it, as the operator reads worst;
        # of several as bad, the last device by name (the first for < and <=), the same each time and
        # in shared_reads.py
        worst = "min" if condition.operator in LOWER_IS_WORSE else "max"
        of_worst = "argMin" if worst == "min" else "argMax"
        values = [self.param(condition.metric, "String"), f"{worst}(x)"]
        if condition.aggregate == "any":  # how often, in that series: its matching samples of all
            passes = f"m >= {self.param(condition.min_matches, 'UInt32')}"
            for suffix, column in ((MATCHES, "m"), (SAMPLES, "n")):
                values += [
                    self.param(condition.metric + suffix, "String"),
                    f"toFloat64({of_worst}({column}, (x, device)))",
                ]
        else:
            passes = self.comparison(condition)
        return (
            f"SELECT node_id, {key} AS key, {of_worst}(device, (x, device)) AS dev, "
            f"map({', '.join(values)}) AS values, {worst}(x) AS v "
            f"FROM ({self.measured(condition)}) "
            f"WHERE n >= {self.param(condition.min_samples, 'UInt32')} AND {passes} "
            f"GROUP BY node_id, key"
        )

    def group(self, group: Group, enclosing: str | None) -> str:
        parts = [self.node(item, enclosing) for item in group.items]
        if len(parts) == 1:
            return parts[0]
        if group.mode == "any":
            union = " UNION ALL ".join(f"({part})" for part in parts)
            return (
                f"SELECT node_id, key, min(dev) AS dev, maxMap(values) AS values, max(v) AS v "
                f"FROM ({union}) GROUP BY node_id, key"
            )
        # the costliest condition streams on the left; the others are built first, and an empty one
        # ends the query before the costly one is read (most conditions match nothing most of the time)
        order = sorted(range(len(parts)), key=lambda i: -read_reach(group.items[i]))
        left = order[0]
        query = f"({parts[left]}) AS t{left}"
        for index in order[1:]:
            on = f"t{left}.node_id = t{index}.node_id AND t{left}.key = t{index}.key"
            query += f" INNER JOIN ({parts[index]}) AS t{index} ON {on}"
        values = "mapConcat(" + ", ".join(f"t{i}.values" for i in range(len(parts))) + ")"
        columns = f"t0.node_id AS node_id, t0.key AS key, t0.dev AS dev, {values} AS values, t0.v AS v"
        return f"SELECT {columns} FROM {query}"

    def family(self, members: Sequence[Condition], enclosing: str | None) -> str:
        """A family's one query (shared_reads.py): rows (r, node_id, key, dev_high, high, dev_low, low) per
        member r (1-based), node and enclosing device, the worst passing series each way; and a row of
        r = 0 for a series whose labels were not found (the caller then reads each member on its own).
        Built with the members' label sets as `any_labels`; the labels of a series come from its raw
        rows in the window, the rows its aggregate reads (a family past the raw TTL is not read
        together)."""
        shared = replace(members[0], labels=())  # each member's labels apply after the shared read
        start, end = self.window(shared)
        key = self.enclosing_key(enclosing)
        enough = f"n >= {self.param(shared.min_samples, 'UInt32')}"
        labelled = any(member.labels for member in members)
        passing = ["if(l.found = 0, [0], [])"] if labelled else []
        for place, member in enumerate(members, start=1):
            tests = [enough, self.comparison(member)]
            if member.labels:
                tests.append(self.labelled(member.labels, "l.series_labels"))
            passing.append(f"if({' AND '.join(tests)}, [{place}], [])")
        series = f"({self.measured(shared)}) AS m"
        if labelled:
            where = [*self.filters(shared), f"timestamp > {start}", f"timestamp <= {end}"]
            labels = (
                f"SELECT labels_key, any(labels) AS series_labels, toUInt8(1) AS found "
                f"FROM {self.database}.metrics WHERE {' AND '.join(where)} GROUP BY labels_key"
            )
            series += f" LEFT JOIN ({labels}) AS l USING (labels_key)"
        # of devices as bad, the one a rule read alone takes (QueryBuilder.leaf): last by name, first for <
        return (
            f"SELECT r, node_id, {key} AS key, argMax(device, (x, device)) AS dev_high, max(x) AS high, "
            "argMin(device, (x, device)) AS dev_low, min(x) AS low "
            f"FROM {series} ARRAY JOIN arrayConcat({', '.join(passing)}) AS r "
            "GROUP BY r, node_id, key ORDER BY r, node_id, key"
        )

    def node(self, item: Condition | Group, enclosing: str | None) -> str:
        return self.leaf(item, enclosing) if isinstance(item, Condition) else self.group(item, enclosing)


def _bits(x: str) -> str:
    """`x` as a bitmask: a non-finite value (stored before entries refused it) has no bits."""
    return f"toUInt64(if(isFinite({x}), {x}, 0))"


def read_reach(item: Condition | Group) -> int:
    """Seconds of rows a condition reads: how costly it is, roughly."""
    if isinstance(item, Group):
        return sum(read_reach(child) for child in item.items)
    return item.window_seconds + item.history_seconds * (item.baseline == "node")


def enclosing_pattern(rule: Rule, catalog: Catalog) -> str | None:
    """The pattern of the device kind enclosing every metric of `rule` (gpu for a GPU's NVLink links
    and its temperature), whose name keys its matches; None where they differ (one match per node)."""
    kinds = {catalog.enclosing(metric) for metric in rule.metrics}
    (outer,) = kinds if len(kinds) == 1 else (None,)
    return outer.pattern if outer else None


def rule_query(
    rule: Rule,
    database: str,
    at_ms: int,
    raw_ttl_seconds: int = DEFAULT_RAW_TTL_DAYS * 86400,
    catalog: Catalog | None = None,
    nodes: Sequence[str] | None = None,
    via: str = "rollup",
) -> tuple[str, dict[str, Any]]:
    """The one query that evaluates `rule` at `at_ms` over every node (or only `nodes`), for a store
    whose raw TTL is `raw_ttl_seconds` (store.ttl.raw_ttl_seconds; default: a new database's);
    `via="raw"` reads no rollup where the raw rows can answer (the answer is the same: the tests
    compare them)."""
    catalog = catalog or default_catalog()
    builder = QueryBuilder(database, at_ms, raw_ttl_seconds, nodes, rollup=via == "rollup")
    body = builder.node(rule.when, enclosing_pattern(rule, catalog))
    # one match per node (and enclosing device): the first condition's value, every condition's values
    sql = (
        f"SELECT node_id, any(dev) AS device, any(v) AS value, maxMap(values) AS all_values FROM ({body}) "
        f"GROUP BY node_id, key"
    )
    if rule.correlate_by:
        column = rule.correlate_by
        sql = (
            f"SELECT m.*, g.grp AS grp, uniqExact(m.node_id) OVER (PARTITION BY g.grp) AS peers "
            f"FROM ({sql}) AS m LEFT JOIN (SELECT node_id, argMax({column}, updated_at) AS grp "
            f"FROM {database}.nodes GROUP BY node_id) AS g ON m.node_id = g.node_id"
        )
    else:
        sql = f"SELECT *, '' AS grp, 1 AS peers FROM ({sql})"
    return builder.statement(f"{sql} ORDER BY node_id, device")


def sample_counts(
    store: Store, condition: Condition, nodes: Sequence[str], at_ms: int, seconds: int
) -> dict[tuple[str, str], int]:
    """Per node of `nodes` and device, the samples (timestamps, each once) of the series `condition`
    reads in the `seconds` before `at_ms`: what says whether fresh data stands behind a silence."""
    # only the builder's filters are used: the raw rows themselves are counted, whatever the TTL
    builder = QueryBuilder(store.database, at_ms, raw_ttl_seconds=0, nodes=nodes)
    table = "bench_results" if condition.metric.startswith("bench_") else "metrics"
    where = [
        *builder.filters(condition),
        "timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')",
        "timestamp > fromUnixTimestamp64Milli({at:Int64}, 'UTC') "
        f"- toIntervalSecond({builder.param(seconds, 'UInt32')})",
    ]
    rows = store.query(
        f"SELECT node_id, device, uniqExact(timestamp) FROM {store.database}.{table} "
        f"WHERE {' AND '.join(where)} GROUP BY node_id, device",
        builder.params,
    )
    return {(str(node), str(device)): int(count) for node, device, count in rows}


# stores already seen with metrics_hourly (the database each had then): once there, it stays
_WITH_ROLLUP: weakref.WeakKeyDictionary[Store, str] = weakref.WeakKeyDictionary()


def has_hourly_rollup(store: Store) -> bool:
    if _WITH_ROLLUP.get(store) != store.database:
        rows = store.query(
            "SELECT count() FROM system.tables WHERE database = {db:String} AND name = 'metrics_hourly'",
            {"db": store.database},
        )
        if not rows or not rows[0][0]:
            return False
        _WITH_ROLLUP[store] = store.database
    return True


def evaluate(
    store: Store,
    rule: Rule,
    at_ms: int,
    raw_ttl_seconds: int | None = None,
    catalog: Catalog | None = None,
    nodes: Sequence[str] | None = None,
    via: str = "rollup",
) -> list[Match]:
    """`rule`'s matches at `at_ms`; `raw_ttl_seconds`: the store's raw TTL, read from it if not given."""
    if raw_ttl_seconds is None:
        raw_ttl_seconds = stored_raw_ttl_seconds(store)
    return rule_matches(store, rule, at_ms, raw_ttl_seconds, catalog, nodes, _via(store, via))


def _via(store: Store, via: str) -> str:
    if via == "rollup" and not has_hourly_rollup(store):
        return "raw"  # a database from before metrics_hourly, until `db init` adds it
    return via


def rule_matches(
    store: Store,
    rule: Rule,
    at_ms: int,
    raw_ttl_seconds: int,
    catalog: Catalog | None,
    nodes: Sequence[str] | None,
    via: str,
) -> list[Match]:
    sql, params = rule_query(rule, store.database, at_ms, raw_ttl_seconds, catalog, nodes, via)
    matches: list[Match] = []
    groups: dict[str, Match] = {}
    for node, device, value, values, group, peers in store.query(sql, params):
        values = {k: float(v) for k, v in values.items()}
        if rule.correlate_by and group and peers >= rule.correlate_min_nodes:
            shared = groups.get(group)
            if shared is None:
                shared = groups[group] = Match(f"{rule.correlate_by}:{group}", "", float(value), {})
                matches.append(shared)
            shared.nodes.append(node)
            shared.value = max(shared.value, float(value))
            for metric, metric_value in values.items():
                shared.values[metric] = max(shared.values.get(metric, metric_value), metric_value)
            continue
        matches.append(Match(node, device, float(value), values))
    return matches


def family_matches(
    store: Store,
    rules: Sequence[Rule],
    at_ms: int,
    raw_ttl_seconds: int,
    catalog: Catalog,
    nodes: Sequence[str] | None,
    via: str,
) -> list[list[Match]] | None:
    """The matches of each rule of one family (shared_reads.py), read in one query: those `rule_matches`
    gives each, in the same order; None where the family is not read together (its window reaches
    past the raw TTL, or a series' labels were not found), so that each rule is read on its own."""
    members = [sole_condition(rule) for rule in rules]
    assert all(members), "a family's rules have one condition each"
    conditions = [member for member in members if member is not None]
    builder = QueryBuilder(
        store.database,
        at_ms,
        raw_ttl_seconds,
        nodes,
        rollup=via == "rollup",
        any_labels=[condition.labels for condition in conditions],
    )
    if builder.daily(conditions[0]):
        return None
    kind = catalog.enclosing(conditions[0].metric)
    sql, params = builder.statement(builder.family(conditions, kind.pattern if kind else None))
    found: list[list[Match]] = [[] for _ in rules]
    for place, node, _key, dev_high, high, dev_low, low in store.query(sql, params):
        if place == 0:  # raw rows expired under an hourly read (an instant in the past): rule by rule
            log.debug("rules %s: a series' labels not in its raw rows; read one by one", _ids(rules))
            return None
        condition = conditions[place - 1]
        device, value = worst(condition, (dev_high, float(high)), (dev_low, float(low)))
        found[place - 1].append(Match(node, device, value, {condition.metric: value}))
    for matches in found:
        matches.sort(key=lambda match: (match.node_id, match.device))
    return found


# Each reader is a connection of its own (a session on a server): a few are enough for the rule
# queries, most of which use one core; benchmarks/diagnosis_cycle.py measures the default.
MAX_READERS = 4
READERS_VARIABLE = "STETHOSCOPE_READERS"


def query_threads(dsn: str, cores: int, readers: int) -> int | None:
    """The threads each query of a cycle read by `readers` connections may use: the embedded store's
    `cores` shared among them (ClickHouse's own threads on top of one reader a core only contend);
    None, ClickHouse's default, for one reader, or a server's store, whose cores are not these (and
    whose `readonly` users refuse a query's SETTINGS)."""
    if readers <= 1 or not is_embedded(dsn):
        return None
    return max(1, cores // readers)


def usable_cores() -> int:
    counted = getattr(os, "process_cpu_count", None)  # Python 3.13: the cores this process may use
    if counted is not None:
        return counted() or 1
    if hasattr(os, "sched_getaffinity"):  # Linux
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def readers_wanted() -> int:
    """How many connections read the rules at once: STETHOSCOPE_READERS where it is set (1 reads them
    one after another on the caller's own), else one per core this process may use, up to
    MAX_READERS. A value that is no whole number of 1 or more is a ConfigError (exit 2)."""
    raw = os.environ.get(READERS_VARIABLE, "").strip()
    if not raw:
        return max(1, min(MAX_READERS, usable_cores()))
    try:
        wanted = int(raw)
    except ValueError:
        wanted = 0
    if wanted < 1:
        raise ConfigError(f"{READERS_VARIABLE}={raw!r}: a whole number of connections, 1 or more")
    return wanted


def evaluate_all(
    store: Store,
    rules: Sequence[Rule],
    at_ms: int,
    nodes: Sequence[str] | None = None,
    readers: int | None = None,
    via: str = "rollup",
    raw_ttl_seconds: int | None = None,
) -> Evaluation:
    """Every rule's matches, in the order of `rules`: the same answer as `evaluate` rule by rule (a
    family of rules that share their read in one query: shared_reads.py), read by `readers` connections
    at once (default `readers_wanted()`), the caller's store and `readers - 1` more
    (`Store.reader`), the costliest rules first. On 2 cores 2 readers took about
    a third less time than one (benchmarks/diagnosis_cycle.py).

    A rule whose query fails while the store still answers is a RuleFailure and the others go on.
    When the store itself fails (it does not answer, or the schema is missing), the rules not
    started yet are not read and its error is raised as `evaluate` would raise it (of several failed
    by then, the first of the cycle's queries). A plain rule whose window's read failed is read by its
    own query after the others, on the caller's store. `raw_ttl_seconds`: the store's raw TTL, read
    from it once if not given."""
    if not rules:
        return Evaluation([])
    read = _read_all(store, rules, at_ms, nodes, readers, via, raw_ttl_seconds)
    return _gathered([read[id(rule)] for rule in rules])


def _read_all(
    store: Store,
    rules: Sequence[Rule],
    at_ms: int,
    nodes: Sequence[str] | None,
    readers: int | None,
    via: str,
    raw_ttl_seconds: int | None,
) -> dict[int, tuple[list[Match], RuleFailure | None]]:
    """Each rule's matches and failure, by the rule's id(): `evaluate_all` for the rules it reads,
    a family of them (shared_reads.py) in one read, the plain rules from one read per window
    (window_reads.py)."""
    via = _via(store, via)
    ttl = raw_ttl_seconds if raw_ttl_seconds is not None else stored_raw_ttl_seconds(store)
    catalog = default_catalog()  # loaded here once, not by the threads together
    tasks, judged = planned_reads(store.database, rules, at_ms, ttl, nodes, via)
    count = min(readers if readers is not None else readers_wanted(), len(tasks))
    windows: dict[ReadKey, Mapping[str, list[Series]] | None] = {}  # None: the window's read failed

    def read(handle: Store, task: Task) -> dict[int, tuple[list[Match], RuleFailure | None]]:
        if isinstance(task, WindowRead):
            windows[(task.window_seconds, task.increases)] = _window_series(handle, task, at_ms, ttl, nodes)
            return {}
        results = _guarded_unit(handle, task, at_ms, ttl, catalog, nodes, via)
        return dict(zip(map(id, task), results, strict=True))

    def judged_rules() -> dict[int, tuple[list[Match], RuleFailure | None]]:
        return {
            id(rule): _judged_plain(
                rule, windows, catalog, partial(_guarded, store, rule, at_ms, ttl, catalog, nodes, via)
            )
            for rule in judged
        }

    if count <= 1:
        found = {key: result for task in tasks for key, result in read(store, task).items()}
        return found | judged_rules()
    idle: queue.SimpleQueue[Store] = queue.SimpleQueue()
    opened: list[Store] = []

    threads = query_threads(store.dsn, usable_cores(), count)

    def one(task: Task) -> dict[int, tuple[list[Match], RuleFailure | None]]:
        handle = idle.get()
        shared = QUERY_THREADS.set(threads)
        try:
            return read(handle, task)
        finally:
            QUERY_THREADS.reset(shared)
            idle.put(handle)

    try:
        for _ in range(count - 1):
            opened.append(store.reader())
        for handle in [store, *opened]:
            idle.put(handle)
        with ThreadPoolExecutor(max_workers=count, thread_name_prefix="rules") as pool:
            # the costliest first, so that no long read is left running alone at the end
            costliest = sorted(range(len(tasks)), key=lambda i: -_task_reach(tasks[i]))
            futures = {pool.submit(one, tasks[i]): i for i in costliest}
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            failed = sorted((futures[f], f) for f in done if f.exception() is not None)
            if failed:  # the queries already running end before their handles close
                pool.shutdown(cancel_futures=True)
                error = failed[0][1].exception()
                assert error is not None
                raise error
            found = {key: result for f in done for key, result in f.result().items()}
    finally:
        for handle in opened:
            handle.close()
    return found | judged_rules()


Task = list[Rule] | WindowRead  # one query of a cycle: a rule (or a family of rules), or a window's read


def planned_reads(
    database: str,
    rules: Sequence[Rule],
    at_ms: int,
    raw_ttl_seconds: int,
    nodes: Sequence[str] | None,
    via: str,
) -> tuple[list[Task], list[Rule]]:
    """The queries a cycle makes for `rules`: the rules (and families, shared_reads.py) read by their
    own query, then a read per window of the rules judged from those reads (window_reads.py); and
    those rules."""
    builder = QueryBuilder(database, at_ms, raw_ttl_seconds, nodes, rollup=via == "rollup")

    def hourly(condition: Condition) -> bool:
        return builder.hourly_reads(condition, builder.deep(condition))

    reads = units(rules)
    plain = [all(plain_rule(rule, raw_ttl_seconds, hourly) for rule in unit) for unit in reads]
    judged = [rule for unit, judge_it in zip(reads, plain, strict=True) if judge_it for rule in unit]
    tasks: list[Task] = [unit for unit, judge_it in zip(reads, plain, strict=True) if not judge_it]
    return [*tasks, *window_reads(judged)], judged


def _task_reach(task: Task) -> int:
    """Seconds of rows a query reads, roughly: a window's read reads each of its metrics'."""
    if isinstance(task, WindowRead):
        return task.window_seconds * len(task.metrics)
    return read_reach(task[0].when)


def _window_series(
    store: Store, read: WindowRead, at_ms: int, raw_ttl_seconds: int, nodes: Sequence[str] | None
) -> dict[str, list[Series]] | None:
    """The series of `read`'s metrics, by metric; None where its query failed while the store answers,
    or its rows could not be read (its rules are then read by their own queries, each failing on its
    own), the store's error where it does not answer."""
    builder = QueryBuilder(store.database, at_ms, raw_ttl_seconds, nodes)
    try:
        rows = store.query(*builder.statement(builder.window_read(read)))
        aggregates, bits = len(read.aggregates), len(read.bits)
        found: dict[str, list[Series]] = {}
        for metric, node, device, key, samples, *columns in rows:
            values = dict(zip(read.aggregates, map(float, columns[:aggregates]), strict=True))
            masks = dict(zip(read.bits, map(int, columns[aggregates : aggregates + bits]), strict=True))
            found.setdefault(metric, []).append(
                Series(node, device, labels_of(key), int(samples), values, masks)
            )
    except SchemaMissing:
        raise
    except Exception as exc:
        if isinstance(exc, StoreError) and not store.answers():
            raise
        log.warning(
            "the %d s window's read failed (%s); its rules read by their own", read.window_seconds, exc
        )
        return None
    return found


def _judged_plain(
    rule: Rule,
    windows: Mapping[ReadKey, Mapping[str, list[Series]] | None],
    catalog: Catalog,
    own_query: Callable[[], tuple[list[Match], RuleFailure | None]],
) -> tuple[list[Match], RuleFailure | None]:
    """A plain rule's matches, judged from its windows' series; `own_query`'s where one of its
    windows was not read or it cannot be judged so (window_reads.NotJudged)."""
    read = {read_key(condition): windows.get(read_key(condition)) for condition in rule.conditions}
    enclosing = enclosing_pattern(rule, catalog)
    # a catalog pattern with a group of its own syntax (`(?=`, `(?P<`) may mean one thing to RE2 and
    # another to Python: ClickHouse judges it
    if all(series is not None for series in read.values()) and "(?" not in (enclosing or ""):
        try:
            found = judge(rule, read, enclosing)  # type: ignore[arg-type]
        except NotJudged as exc:
            log.debug("rule %s read by its own query: %s", rule.rule_id, exc)
        except Exception as exc:  # this code's fault, not the rule's: its own query answers for it
            log.warning("rule %s: judging it failed (%s); read by its own query", rule.rule_id, exc)
        else:
            return _judged(rule, [Match(*match) for match in found])
    return own_query()


def _guarded_unit(
    store: Store,
    unit: list[Rule],
    at_ms: int,
    raw_ttl_seconds: int,
    catalog: Catalog,
    nodes: Sequence[str] | None,
    via: str,
) -> list[tuple[list[Match], RuleFailure | None]]:
    """`_guarded` for each rule of a read: a family's in one query, each member failing with the
    store's error where that query fails while the store answers (a rule read alone would fail the
    same way: the members differ only in labels and thresholds); where it is not read together, or
    fails in this code, each rule on its own (told)."""
    if len(unit) > 1:
        try:
            found = family_matches(store, unit, at_ms, raw_ttl_seconds, catalog, nodes, via)
        except SchemaMissing:
            raise
        except StoreError as exc:
            if not store.answers():
                raise
            return [_failed(rule, exc) for rule in unit]
        except Exception as exc:
            log.warning("rules %s: their shared read failed (%s); each is read on its own", _ids(unit), exc)
            found = None
        if found is not None:
            return [_judged(rule, matches) for rule, matches in zip(unit, found, strict=True)]
    return [_guarded(store, rule, at_ms, raw_ttl_seconds, catalog, nodes, via) for rule in unit]


def _guarded(
    store: Store,
    rule: Rule,
    at_ms: int,
    raw_ttl_seconds: int,
    catalog: Catalog,
    nodes: Sequence[str] | None,
    via: str,
) -> tuple[list[Match], RuleFailure | None]:
    """The rule's matches, and its failure: its query's, when the store still answers (else the
    store's error is raised), or `_judged`'s."""
    try:
        matches = rule_matches(store, rule, at_ms, raw_ttl_seconds, catalog, nodes, via)
    except SchemaMissing:
        raise
    except Exception as exc:
        if isinstance(exc, StoreError) and not store.answers():
            raise
        return _failed(rule, exc)
    return _judged(rule, matches)


def _failed(rule: Rule, exc: Exception) -> tuple[list[Match], RuleFailure]:
    """No matches, and the rule's query failure: the store's message, else the exception's."""
    error = str(exc) if isinstance(exc, StoreError) else f"{type(exc).__name__}: {exc}"
    return [], RuleFailure(rule.rule_id, f"{rule.file}:{rule.line}", error)


def _ids(rules: Sequence[Rule]) -> str:
    return ", ".join(rule.rule_id for rule in rules)


def _judged(rule: Rule, matches: list[Match]) -> tuple[list[Match], RuleFailure | None]:
    """The matches whose aggregates are finite numbers, and a failure naming the series whose are not
    (a counter's delta past any float): those are told and never matched."""
    finite = [m for m in matches if _is_finite(m)]
    if len(finite) == len(matches):
        return matches, None
    told = [_series(m) for m in matches if not _is_finite(m)]
    shown = "; ".join(told[:NONFINITE_SHOWN]) + (
        f"; and {len(told) - NONFINITE_SHOWN} more" if len(told) > NONFINITE_SHOWN else ""
    )
    error = f"aggregate not a finite number for {len(told)} series: {shown}"
    return finite, RuleFailure(rule.rule_id, f"{rule.file}:{rule.line}", error, AGGREGATE)


def _is_finite(match: Match) -> bool:
    return math.isfinite(match.value) and all(math.isfinite(v) for v in match.values.values())


def _series(match: Match) -> str:
    bad = {k: v for k, v in match.values.items() if not math.isfinite(v)} or {"value": match.value}
    return f"{match.node_id} {match.device or '-'} " + ", ".join(f"{k}={v}" for k, v in sorted(bad.items()))


def _gathered(results: list[tuple[list[Match], RuleFailure | None]]) -> Evaluation:
    evaluation = Evaluation([])
    for matches, failure in results:
        if failure is not None:
            evaluation.failures.append(failure)
        evaluation.matches.append(matches)
    return evaluation
