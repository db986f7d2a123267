"""How often each series really reports, and the rules fitted to it (docs/design.md "Rules").

A rule is written for the catalog's cadence (sweeps every 60 s, the stream every 5 s); a cluster
sweeps every 2 to 10 minutes, with jitter and lost sweeps. A condition's interval is the larger of
the declared one (the catalog as the inventory sets it; the stream's period for a `source=stream`
series, never the sweeps') and the spacing its metric's series have shown over the last hours
(`metrics_hourly`, as UNKNOWN learns it: the median spacing inside the hours that hold two samples
or more; of the inventory's nodes, the 90th percentile over the metric's series, so that the fleet's
windows hold their reports and one node's late sweeps do not stretch them all). `Cadence.fit`
stretches each window to 3 reports at that interval and asks for its share of the reports the window
expects (`Condition.at_cadence`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from stethoscope.diagnosis.rules import Condition, Group, Rule
from stethoscope.store.client import Store

# Hours of metrics_hourly the learned cadence reads: recent enough to follow a changed sweep
# interval within a few hours, long enough to hold several sweeps of a slow cadence.
LEARN_HOURS = 6
# The spacing of a metric is that of its series at this quantile: most of the fleet's windows hold
# their reports, and one node's late or failing sweeps do not stretch every node's windows (its own
# findings are held by the hysteresis, and UNKNOWN speaks when it falls silent).
SPREAD = 0.9
_HOUR_MS = 3_600_000

# Never UNKNOWN, and not learned: training-job metrics (a job that ends stops reporting), benchmark
# records, and the stream collector's own health (device `collector`).
SKIPPED = (
    "NOT startsWith(metric_name, 'train_') AND NOT startsWith(metric_name, 'cuda_') "
    "AND NOT startsWith(metric_name, 'bench_') AND labels['phase'] != 'bench' AND device != 'collector'"
)


def hours_sql(db: str) -> str:
    """Per series (labels apart) and hour since {from_s}: first and last sample, last value, count.
    From the rollup; only a series with rows after the evaluation time (an evaluation in the past)
    reads its raw rows of the hour being evaluated."""
    key = "node_id, metric_name, device, labels_key"
    history = (
        f"SELECT {key}, any(labels)['source'] AS source, hour, "
        "toUnixTimestamp64Milli(min(first_at)) AS first_ms, toUnixTimestamp64Milli(max(last_at)) AS last_ms, "
        f"argMaxMerge(last_value) AS last_value, sum(samples) AS n FROM {db}.metrics_hourly "
        "WHERE hour >= toDateTime({from_s:Int64}, 'UTC') AND hour <= toDateTime({hour_s:Int64}, 'UTC') "
        f"AND {SKIPPED} GROUP BY {key}, hour "
        "HAVING hour < toDateTime({hour_s:Int64}, 'UTC') OR last_ms <= {at:Int64}"
    )
    late = (
        f"SELECT {key} FROM {db}.metrics_hourly WHERE hour = toDateTime({{hour_s:Int64}}, 'UTC') "
        f"GROUP BY {key} HAVING max(last_at) > fromUnixTimestamp64Milli({{at:Int64}}, 'UTC')"
    )
    recent = (
        f"SELECT {key}, any(labels)['source'] AS source, "
        "toDateTime({hour_s:Int64}, 'UTC') AS hour, toUnixTimestamp64Milli(min(timestamp)) AS first_ms, "
        "toUnixTimestamp64Milli(max(timestamp)) AS last_ms, argMax(value, timestamp) AS last_value, "
        f"count() AS n FROM {db}.metrics "
        "WHERE timestamp >= fromUnixTimestamp64Milli({hour_ms:Int64}, 'UTC') "
        "AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') "
        f"AND ({key}) IN ({late}) AND {SKIPPED} GROUP BY {key}"
    )
    return f"{history} UNION ALL {recent}"


# The spacing a series has shown inside its hours of two samples or more ((last - first) / (n - 1):
# a partial hour says the same as a full one).
SPACING_SQL = "quantileExactIf(0.5)((last_ms - first_ms) / 1000 / (n - 1), n >= 2)"


def hour_params(at_ms: int, hours_back: int) -> dict[str, int]:
    hour_ms = at_ms - at_ms % _HOUR_MS
    return {
        "at": at_ms,
        "hour_ms": hour_ms,
        "hour_s": hour_ms // 1000,
        "from_s": (hour_ms - hours_back * _HOUR_MS) // 1000,
    }


def learned_intervals(
    store: Store, at_ms: int, nodes: Sequence[str] | None = None, hours: int = LEARN_HOURS
) -> dict[tuple[str, bool], float]:
    """(metric, from the stream) -> the spacing in seconds its series show (the SPREAD quantile over
    the series that showed theirs: two samples or more in at least half of their hours) in the last
    `hours`, of `nodes` only where given (another cluster sharing the database is not this one)."""
    where = "WHERE node_id IN {nodes:Array(String)}" if nodes is not None else ""
    per_series = (
        f"SELECT metric_name, source = 'stream' AS stream, {SPACING_SQL} AS spacing "
        f"FROM ({hours_sql(store.database)}) {where} GROUP BY node_id, metric_name, device, source "
        "HAVING countIf(n >= 2) * 2 >= count() AND countIf(n >= 2) > 0"
    )
    params: dict[str, object] = {**hour_params(at_ms, hours), "spread": SPREAD}
    if nodes is not None:
        params["nodes"] = sorted(nodes)
    rows = store.query(
        f"SELECT metric_name, stream, quantileExact({{spread:Float64}})(spacing) FROM ({per_series}) "
        "GROUP BY metric_name, stream",
        params,
    )
    return {(str(metric), bool(stream)): float(spacing) for metric, stream, spacing in rows}


@dataclass
class Cadence:
    """The intervals the series have shown (empty: the declared ones alone, as for a new store)."""

    learned: dict[tuple[str, bool], float] = field(default_factory=dict)

    @classmethod
    def learn(cls, store: Store, at_ms: int, nodes: Sequence[str] | None = None) -> Cadence:
        """From the store (of `nodes` only where given); the declared intervals alone on a database
        from before metrics_hourly."""
        from stethoscope.diagnosis.engine import has_hourly_rollup

        return cls(learned_intervals(store, at_ms, nodes) if has_hourly_rollup(store) else {})

    def interval(self, condition: Condition) -> int:
        """The condition's interval: the declared one, or the spacing its series show if longer. A
        condition that does not filter on `source` reads the sweeps' series at theirs."""
        shown = self.learned.get((condition.metric, condition.stream))
        if shown is None and not condition.stream:  # a metric the stream alone reports
            shown = self.learned.get((condition.metric, True))
        return max(condition.interval_seconds, round(shown or 0))

    def fit(self, rule: Rule) -> Rule:
        return replace(rule, when=self._fit_group(rule.when))

    def fit_all(self, rules: Sequence[Rule]) -> list[Rule]:
        return [self.fit(rule) for rule in rules]

    def _fit_group(self, group: Group) -> Group:
        items = tuple(
            self._fit_group(item) if isinstance(item, Group) else item.at_cadence(self.interval(item))
            for item in group.items
        )
        return replace(group, items=items)


def window_of(rule: Rule) -> int:
    """The longest window the rule reads (as fitted): how long its condition must stay clear on
    fresh data before its finding resolves."""
    return max((c.window_seconds for c in rule.conditions), default=0)
