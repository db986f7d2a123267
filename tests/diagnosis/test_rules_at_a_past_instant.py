"""A rule evaluated at a past instant (`diagnose --at`, the audit's replay) reads nothing stored after
it, also where its window reaches past the raw TTL into the daily rollup: the rollup's row for the
instant's own day holds that whole day, so that partial day is read from the raw rows.

The audit once warned of a worn SSD hours before its onset: at 00:19 the 31-day growth rule read
the day's rollup row, whose last value was the count the drive reached at 06:19."""

from __future__ import annotations

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.store.result_rows import rows_from_result
from stethoscope.timeutil import now_ms

from conftest import TOP

DAY = 86_400_000
TODAY = now_ms() // DAY * DAY
YESTERDAY = TODAY - DAY
INSTANT = YESTERDAY + 11 * 3_600_000  # before the climb of the day it falls in
CLIMB = YESTERDAY + 12 * 3_600_000


def _rule(rule_id: str):
    rules = load_rules(TOP / "rules/storage/ssd_wear.yml", Catalog.load()).rules
    (rule,) = [r for r in rules if r.rule_id == rule_id]
    return rule


def _sweeps(store) -> None:
    """Ten-minute SMART sweeps over the day before yesterday and yesterday, as the collector returns
    them: the count flat at 4 until yesterday 12:00, then 2 more a sweep."""
    batch = MetricColumns()
    for at in range(YESTERDAY - DAY, TODAY, 600_000):
        count = 4 if at < CLIMB else 4 + 2 * ((at - CLIMB) // 600_000)
        metric = {"name": "smart_reallocated_sector_ct", "device": "sda", "value": float(count), "labels": {}}
        metrics = [metric]
        batch.extend(rows_from_result("node07", {"stethoscope_metrics": metrics}, "sweep", at).metrics)
    store.insert_metrics(batch)


def test_a_month_long_window_at_a_past_instant_does_not_read_the_rest_of_its_day(store):
    _sweeps(store)
    growth = _rule("ssd_reallocated_growth")
    assert evaluate(store, growth, INSTANT) == []
    (late,) = evaluate(store, growth, TODAY - 60_000)
    assert (late.node_id, late.device) == ("node07", "sda")
    assert late.value > 50


def test_the_partial_day_counts_up_to_the_instant(store):
    _sweeps(store)
    growth = _rule("ssd_reallocated_growth")
    # two hours into the climb: 4 -> 28 sectors, 600 %, from the raw rows of the instant's day alone
    (match,) = evaluate(store, growth, CLIMB + 2 * 3_600_000)
    assert round(match.value) == 600
