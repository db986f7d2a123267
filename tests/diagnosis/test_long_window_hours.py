"""A window longer than the raw TTL reads one row a day from metrics_daily for the days before the
evaluation time's own; of that day, the whole hours come from metrics_hourly (one row an hour) and only
the raw rows of the hours cut by the window's ends are read. At 200 nodes a 5-second series' day of raw
rows was a fifth of the cycle's CPU time (benchmarks/diagnosis_cycle.py, ssd_reallocated_growth).

Each test empties `metrics` after writing (its rollups keep their rows): what is still found was read
from a rollup, what is lost was read from the raw rows."""

from __future__ import annotations

import textwrap

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

CATALOG = Catalog.load()
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
# an evaluation at 18:30 UTC of yesterday: its day holds 18 whole hours before the one it cuts
AT = (now_ms() // DAY_MS - 1) * DAY_MS + 18 * HOUR_MS + 30 * 60_000


COUNTER, GAUGE = "smart_reallocated_sector_ct", "disk_temperature_celsius"


def long_rule(tmp_path, aggregate: str, operator: str = ">", threshold: float = 0):
    metric = COUNTER if aggregate in ("last", "growth_percent") else GAUGE
    path = tmp_path / "rule.yml"
    path.write_text(
        textwrap.dedent(
            f"""
            rule_id: long_window
            description: test
            severity: warning
            trigger:
              - {{metric: {metric}, operator: "{operator}", threshold: {threshold},
                 window: 35d, aggregate: {aggregate}}}
            """
        )
    )
    result = load_rules(path, CATALOG)
    assert result.errors == []
    return result.rules[0]


def write(store, samples: list[tuple[int, float]]) -> None:
    batch = MetricColumns()
    for metric in (COUNTER, GAUGE):
        for at, value in samples:
            batch.append("n1", metric, "sda", {}, value, at)
    store.insert_metrics(batch)


def found(store, rule, at: int = AT) -> dict[str, float]:
    return {m.node_id: round(m.value, 6) for m in evaluate(store, rule, at)}


def raw_rows_gone(store) -> None:
    store.command(f"TRUNCATE TABLE {store.database}.metrics")


@pytest.mark.parametrize("aggregate", ["last", "max"])
def test_the_days_whole_hours_are_read_from_the_hourly_rollup(tmp_path, store, aggregate):
    rule = long_rule(tmp_path, aggregate)
    write(store, [(AT - 5 * HOUR_MS, 7.0)])  # 13:30, a whole hour of the day
    before = found(store, rule)
    raw_rows_gone(store)
    assert before == found(store, rule) == {"n1": 7.0}


def test_the_hour_the_evaluation_cuts_is_read_from_the_raw_rows(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    write(store, [(AT - 5 * HOUR_MS, 7.0), (AT - 10 * 60_000, 9.0)])  # 13:30 and 18:20
    assert found(store, rule) == {"n1": 9.0}
    raw_rows_gone(store)
    assert found(store, rule) == {"n1": 7.0}  # 18:20 was only in the raw rows


def test_an_evaluation_in_the_days_first_hour_reads_its_raw_rows_to_the_end(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    at = AT - 18 * HOUR_MS  # 00:30: no whole hour of the day yet
    write(store, [(at - 3 * DAY_MS, 7.0), (at, 9.0), (at + 1, 50.0)])
    assert found(store, rule, at) == {"n1": 9.0}


def test_a_sample_after_the_evaluation_time_is_not_read(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    write(store, [(AT - 5 * HOUR_MS, 7.0), (AT + 10 * 60_000, 50.0)])  # the 18:00 hour holds both
    assert found(store, rule) == {"n1": 7.0}


@pytest.mark.parametrize(
    "aggregate, expected",
    [("last", 30.0), ("max", 30.0), ("min", 10.0), ("growth_percent", 200.0)],
)
def test_last_max_min_and_growth_read_as_from_the_raw_rows(tmp_path, store, aggregate, expected):
    """Every sample in hours of its own: one value an hour is each hour's whole answer."""
    rule = long_rule(tmp_path, aggregate, ">=", 0)
    write(store, [(AT - 3 * DAY_MS, 10.0), (AT - 9 * HOUR_MS, 20.0), (AT - 2 * HOUR_MS, 30.0)])
    assert found(store, rule) == {"n1": expected}


def test_a_whole_hour_stands_for_its_last_value(tmp_path, store):
    """As a day does: an average over 35 days weighs one value an hour of the evaluation's day, not every
    sample of it (a 5-second series would otherwise outweigh a month of days)."""
    rule = long_rule(tmp_path, "avg")
    hour = AT - 5 * HOUR_MS - 30 * 60_000  # 13:00
    write(
        store,
        [(AT - 3 * DAY_MS, 10.0), (hour + 60_000, 100.0), (hour + 120_000, 100.0), (hour + 180_000, 30.0)],
    )
    assert found(store, rule) == {"n1": 20.0}
    # a database without metrics_hourly (`via="raw"`, as engine._via reads it) weighs every raw row
    assert {m.node_id: m.value for m in evaluate(store, rule, AT, via="raw")} == {"n1": 60.0}
