"""A window longer than the raw TTL reads one row a day from metrics_daily for the days before the
evaluation time's own; of that day, for `last`, `max` and `min`, the whole hours come from
metrics_hourly (one row an hour, the hour's whole answer for those) and only the raw rows of the hour
the evaluation time cuts are read; every other aggregate reads that day's raw rows. A 5-second series'
day of raw rows made ssd_reallocated_growth (31 days) the costliest rule of a cycle at 200 nodes
(benchmarks/diagnosis_cycle.py: 0.67 s of a rule-by-rule pass, 0.17 s now).

Tests that empty `metrics` after writing (its rollups keep their rows) tell where a read comes from:
what is still found was read from a rollup, what is lost was read from the raw rows."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

CATALOG = Catalog.load()
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
MIDNIGHT = (now_ms() // DAY_MS - 1) * DAY_MS  # yesterday's
# an evaluation at 18:30 UTC of yesterday: its day holds 18 whole hours before the one it cuts
AT = MIDNIGHT + 18 * HOUR_MS + 30 * 60_000
THIRTEEN = MIDNIGHT + 13 * HOUR_MS  # the start of a whole hour of that day
COUNTER, GAUGE = "smart_reallocated_sector_ct", "disk_temperature_celsius"


def long_rule(
    tmp_path, aggregate: str, operator: str = ">", threshold: float = 0, extra: str = "", window="35d"
):
    metric = COUNTER if aggregate == "growth_percent" else GAUGE
    path = tmp_path / "rule.yml"
    path.write_text(
        textwrap.dedent(
            f"""
            rule_id: long_window
            description: test
            severity: warning
            trigger:
              - {{metric: {metric}, operator: "{operator}", threshold: {threshold},
                 window: {window}, aggregate: {aggregate}{extra}}}
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


def found(store, rule, at: int = AT, via: str = "rollup") -> dict[str, float]:
    return {m.node_id: round(m.value, 6) for m in evaluate(store, rule, at, via=via)}


def raw_rows_gone(store) -> None:
    store.command(f"TRUNCATE TABLE {store.database}.metrics")


@pytest.mark.parametrize("aggregate, expected", [("last", 12.0), ("max", 40.0), ("min", 5.0)])
def test_the_days_whole_hours_are_read_from_the_hourly_rollup(tmp_path, store, aggregate, expected):
    rule = long_rule(tmp_path, aggregate)
    hour = [(THIRTEEN + minute * 60_000, value) for minute, value in ((10, 40.0), (30, 5.0), (50, 12.0))]
    write(store, [(AT - 3 * DAY_MS, 20.0), *hour])
    before = found(store, rule)
    raw_rows_gone(store)
    assert before == found(store, rule) == {"n1": expected}
    assert found(store, rule, via="raw") == {"n1": 20.0}  # without the hourly rollup: the raw rows


def test_the_hour_the_evaluation_cuts_is_read_from_the_raw_rows(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    write(store, [(AT - 5 * HOUR_MS, 7.0), (AT - 10 * 60_000, 9.0)])  # 13:30 and 18:20
    assert found(store, rule) == {"n1": 9.0}
    raw_rows_gone(store)
    assert found(store, rule) == {"n1": 7.0}  # 18:20 was only in the raw rows


def test_an_evaluation_in_the_days_first_hour_reads_its_raw_rows_to_the_end(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    at = MIDNIGHT + 30 * 60_000  # 00:30: no whole hour of the day yet
    write(store, [(at - 3 * DAY_MS, 7.0), (at, 9.0), (at + 1, 50.0)])
    assert found(store, rule, at) == {"n1": 9.0}


def test_an_evaluation_at_midnight_reads_the_day_before_once_and_its_sample_at_midnight(tmp_path, store):
    rule = long_rule(tmp_path, "avg")
    write(store, [(MIDNIGHT - 1, 10.0), (MIDNIGHT, 30.0)])
    assert found(store, rule, MIDNIGHT) == {"n1": 20.0}


def test_an_evaluation_on_the_hour_reads_its_sample_at_that_instant(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    write(store, [(THIRTEEN - 30 * 60_000, 7.0), (THIRTEEN, 9.0)])
    assert found(store, rule, THIRTEEN) == {"n1": 9.0}


def test_a_sample_after_the_evaluation_time_is_not_read(tmp_path, store):
    rule = long_rule(tmp_path, "last")
    write(store, [(AT - 5 * HOUR_MS, 7.0), (AT + 10 * 60_000, 50.0)])  # the 18:00 hour holds both
    assert found(store, rule) == {"n1": 7.0}


@pytest.mark.parametrize("aggregate, expected", [("last", 9.0), ("growth_percent", 28.571429)])
def test_a_sample_at_the_days_midnight_is_read(tmp_path, store, aggregate, expected):
    """Neither the day before's rollup row nor the day's own holds it: it is the day's first sample."""
    rule = long_rule(tmp_path, aggregate, ">=", 0)
    write(store, [(AT - 3 * DAY_MS, 7.0), (MIDNIGHT, 9.0)])
    assert found(store, rule) == {"n1": expected}


@pytest.mark.parametrize(
    "aggregate, expected",
    [("last", 30.0), ("max", 30.0), ("min", 10.0), ("growth_percent", 200.0)],
)
def test_last_max_min_and_growth_read_as_from_the_raw_rows(tmp_path, store, aggregate, expected):
    rule = long_rule(tmp_path, aggregate, ">=", 0)
    write(store, [(AT - 3 * DAY_MS, 10.0), (AT - 9 * HOUR_MS, 20.0), (AT - 2 * HOUR_MS, 30.0)])
    assert found(store, rule) == {"n1": expected}


@pytest.mark.parametrize(
    "aggregate, operator, threshold, extra, expected",
    [
        ("avg", ">", 0, "", 60.0),  # (10 + 100 + 100 + 30) / 4: every sample of the hour
        ("any", ">", 90, "", 100.0),  # the hour's last value is 30
        ("max", ">", 0, ", min_samples: 3", 100.0),  # three samples in one hour
        ("growth_percent", ">", 0, "", 200.0),  # from the day's raw rows: (30 - 10) / 10
    ],
)
def test_every_other_aggregate_reads_the_days_raw_rows(
    tmp_path, store, aggregate, operator, threshold, extra, expected
):
    rule = long_rule(tmp_path, aggregate, operator, threshold, extra)
    samples = [(THIRTEEN + minute * 60_000, value) for minute, value in ((1, 100.0), (2, 100.0), (3, 30.0))]
    write(store, [(AT - 3 * DAY_MS, 10.0), *samples])
    assert found(store, rule) == {"n1": expected}
    raw_rows_gone(store)
    assert found(store, rule) != {"n1": expected}


@pytest.fixture
def kept_120_days(tmp_dsn):
    """`db init --ttl-days 120`: raw rows outlive metrics_hourly's fixed 90 days."""
    with Store(tmp_dsn, f"t_{uuid.uuid4().hex[:8]}") as store:
        store.init_schema(120)
        yield store


def hourly_expired(store) -> None:
    store.command(f"TRUNCATE TABLE {store.database}.metrics_hourly")  # its TTL, come early


def test_with_raw_rows_kept_longer_than_the_hourly_rollup_a_long_window_reads_them(tmp_path, kept_120_days):
    """An evaluation 100 days back with a window past that TTL reads the raw rows, which still hold its
    day, not the rollup, which has let it go."""
    rule = long_rule(tmp_path, "last", window="130d")
    at = AT - 100 * DAY_MS
    write(kept_120_days, [(at - 3 * DAY_MS, 7.0), (at - 5 * HOUR_MS, 9.0)])
    hourly_expired(kept_120_days)
    assert found(kept_120_days, rule, at) == {"n1": 9.0}


def test_with_raw_rows_kept_longer_than_the_hourly_rollup_an_increase_reads_them(tmp_path, kept_120_days):
    """The whole hours of an increase come from the raw rows too: 100 days back the rollup has none."""
    path = tmp_path / "delta.yml"
    path.write_text(
        textwrap.dedent(
            f"""
            rule_id: rising
            description: test
            severity: warning
            trigger:
              - {{metric: {COUNTER}, operator: ">", threshold: 0, window: 3h, aggregate: delta}}
            """
        )
    )
    (rule,) = load_rules(path, CATALOG).rules
    at = AT - 100 * DAY_MS  # at 18:30: 15:30..18:30 holds the whole hours 16:00 and 17:00
    reset = at - 2 * HOUR_MS  # 16:30: the counter starts again from 0
    times = range(at - 5 * HOUR_MS, at + 1, 10 * 60_000)  # every 10 minutes from 13:30
    write(kept_120_days, [(t, 50.0 + i if t < reset else (t - reset) / 600_000) for i, t in enumerate(times)])
    hourly_expired(kept_120_days)
    # 15:30 to 16:20: 5 steps of 1; the reset to 0 at 16:30; 12 steps of 1 to 18:30
    assert found(kept_120_days, rule, at) == {"n1": 17.0}
