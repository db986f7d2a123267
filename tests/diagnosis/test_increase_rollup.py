"""Increases (delta, rate) that read whole hours from metrics_hourly equal the ones the raw rows alone
give, on sweeps in the collector's shape: counters that reset inside an hour and at its edges, flat
counters with an occasional step, gaps of hours and days, replayed batches, series that start inside
the window (events count from 0) and series whose last sample before the window is days old."""

from __future__ import annotations

import random
import textwrap
import uuid

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate, rule_query
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
HOUR_EDGE = now_ms() // HOUR * HOUR - HOUR  # evaluations on, just around and between hour edges
AT = {
    "on_the_hour": HOUR_EDGE,
    "a_ms_after": HOUR_EDGE + 1,
    "a_ms_before": HOUR_EDGE - 1,
    "mid_hour": HOUR_EDGE - 23 * MINUTE - 333,
}
WINDOWS = ("15m", "1h", "6h", "7d")
METRICS = ("ib_symbol_errors_total", "gpu_xid_errors_total")  # a counter, and events (count from 0)
SERIES = 36
RESET_IN_HOUR = "reset-in-hour"  # 0 before the hour; 0, 3, 0, 4 inside it: an increase of 7


def sweep_times(rng: random.Random, first: int, last: int) -> list[int]:
    """A sweep a minute for the last two days, every 10 minutes before (a cadence that changed), each
    a few hundred ms late, with gaps of hours or days where the node was down or unreachable."""
    times, at = [], first
    while at <= last:
        if rng.random() < 0.0008:
            at += rng.randint(1, 40) * HOUR
            continue
        times.append(at + rng.randint(0, 900))
        at += MINUTE if at > last - 2 * DAY else 10 * MINUTE
    return times


def counter_values(rng: random.Random, count: int) -> list[float]:
    """Mostly flat (whole hours with one value), steps now and then, some steady climbers, resets to
    0 or to a little above it (a driver reload, `perfquery -R`), some inside an hour."""
    climber = rng.random() < 0.3
    value = float(rng.choice([0, 1, rng.randint(0, 10**6)]))
    values = []
    for _ in range(count):
        draw = rng.random()
        if draw < 0.003:
            value = float(rng.choice([0, 0, rng.randint(1, 5)]))
        elif climber or draw < 0.04:
            value += rng.randint(0 if climber else 1, 20)
        values.append(value)
    return values


def collector_rows(end: int) -> tuple[MetricColumns, MetricColumns]:
    """The rows, and the batches replayed (stored twice, as a spool replay after a partial write does)."""
    rows, replayed = MetricColumns(), MetricColumns()
    for index in range(SERIES):
        rng = random.Random(index)
        first = end - rng.choice([15 * DAY, 15 * DAY, 3 * DAY, 20 * HOUR, 5 * HOUR, 40 * MINUTE])
        last = end - rng.choice([0, 0, 0, 2 * HOUR, 9 * DAY])
        times = sweep_times(rng, first, last)
        metric, labels = rng.choice([("ib_symbol_errors_total", {}), ("gpu_xid_errors_total", {"xid": "79"})])
        device = "gpu0" if metric == "gpu_xid_errors_total" else "mlx5_0/1"
        values = counter_values(rng, len(times))
        if metric == "gpu_xid_errors_total":  # the collector emits an XID series once it has a count
            values = [v + 1 for v in values]
        node = f"node{index:02d}"
        replay_from = rng.randint(0, max(len(times) - 1, 0))
        for position, (at, value) in enumerate(zip(times, values, strict=True)):
            rows.append(node, metric, device, labels, value, at)
            if replay_from <= position < replay_from + 90:
                replayed.append(node, metric, device, labels, value, at)
    hour = end - 3 * HOUR - end % HOUR
    rows.append(RESET_IN_HOUR, "ib_symbol_errors_total", "mlx5_0/1", {}, 0.0, hour - 10 * MINUTE)
    for minute, value in ((5, 0.0), (15, 3.0), (30, 0.0), (45, 4.0)):
        rows.append(RESET_IN_HOUR, "ib_symbol_errors_total", "mlx5_0/1", {}, value, hour + minute * MINUTE)
    return rows, replayed


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    end = max(AT.values())
    rows, replayed = collector_rows(end)
    with Store(f"chdb://{tmp_path_factory.mktemp('increase') / 'db'}", f"t_{uuid.uuid4().hex[:8]}") as store:
        store.init_schema()
        store.insert_metrics(rows)
        store.insert_metrics(replayed)
        yield store


@pytest.fixture(scope="module")
def increase_rules(tmp_path_factory):
    catalog = Catalog.load()
    text = "".join(
        textwrap.dedent(
            f"""
            - rule_id: {metric}_{aggregate}_{window}
              description: every series' increase
              severity: info
              trigger:
                - {{metric: {metric}, operator: ">=", threshold: 0, window: {window}, aggregate: {aggregate}}}
            """
        )
        for metric, aggregate, window in [
            *((metric, "delta", window) for metric in METRICS for window in WINDOWS),
            ("ib_symbol_errors_total", "rate", "90m"),
            ("gpu_xid_errors_total", "rate", "1d"),
        ]
    )
    path = tmp_path_factory.mktemp("rules") / "increases.yml"
    path.write_text(text)
    loaded = load_rules(path, catalog)
    assert loaded.errors == []
    return loaded.rules


def answers(store, rule, at, via):
    return [(m.node_id, m.device, m.value) for m in evaluate(store, rule, at, via=via)]


@pytest.mark.parametrize("when", sorted(AT))
def test_increase_from_the_hourly_rollup_and_partial_hours_equals_the_raw_rows(swept, increase_rules, when):
    at = AT[when]
    for rule in increase_rules:
        sql, _ = rule_query(rule, swept.database, at, via="rollup")
        assert "metrics_hourly" in sql, rule.rule_id  # the fast path is the one compared
        from_raw = answers(swept, rule, at, "raw")
        assert answers(swept, rule, at, "rollup") == from_raw, rule.rule_id
        assert any(value > 0 for _, _, value in from_raw), rule.rule_id  # the series do move


def test_a_reset_inside_an_hour_whose_last_value_is_its_maximum_counts_both_climbs(swept, increase_rules):
    # min, max and last of that hour (0, 4, 4) are those of a counter that just climbed to 4
    (rule,) = [r for r in increase_rules if r.rule_id == "ib_symbol_errors_total_delta_6h"]
    found = {node: value for node, _, value in answers(swept, rule, AT["on_the_hour"], "rollup")}
    assert found[RESET_IN_HOUR] == 7.0
