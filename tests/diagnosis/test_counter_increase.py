"""One counter-increase definition: the diagnosis engine's SQL (delta) is it; `stethoscope top`'s
Python (report/top.py `increase`) over the same series gives the same increase, resets included."""

from __future__ import annotations

import textwrap

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.report.top import Window, top
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

CATALOG = Catalog.load()
MINUTE = 60_000
AT = now_ms() // MINUTE * MINUTE - MINUTE
METRIC = "ib_symbol_errors_total"


def engine_delta(tmp_path, store, window_minutes: int) -> float:
    path = tmp_path / "rule.yml"
    path.write_text(
        textwrap.dedent(
            f"""
            rule_id: r
            description: test
            severity: warning
            trigger:
              - {{metric: {METRIC}, operator: ">=", threshold: 0, window: {window_minutes}m,
                  aggregate: delta}}
            """
        )
    )
    (rule,) = load_rules(path, CATALOG).rules
    (match,) = evaluate(store, rule, AT)
    return match.value


@pytest.mark.parametrize(
    "values",
    [
        [100, 150, 3, 53, 60, 61, 70, 90, 95, 99],  # a reset mid-series
        [100, 0, 5, 5, 9, 9, 9, 12, 12, 40],  # a reset to zero right after the first sample
        [7, 7, 7, 8, 8, 9, 9, 10, 11, 2],  # a reset at the last sample
    ],
)
@pytest.mark.parametrize("step_minutes", [1, 20])  # within an hour; over whole hours of the rollup
@pytest.mark.parametrize("via", ["raw", "rollup"])
def test_top_and_the_engine_give_one_increase_over_a_counter_with_a_reset(
    tmp_path, store, values, step_minutes, via
):
    times = [AT - (len(values) - 1 - i) * step_minutes * MINUTE for i in range(len(values))]
    batch = MetricColumns()
    for at, value in zip(times, values, strict=True):
        batch.append("n1", METRIC, "mlx5_0/1", {}, float(value), at)
    store.insert_metrics(batch)
    # the engine's window (AT - len * step, AT] holds every sample and none before it: its increase
    # starts from the first sample inside, as top's over [first sample, AT] does
    engine = engine_delta(tmp_path, store, len(values) * step_minutes)
    (entry,) = top(store, CATALOG, METRIC, Window(times[0], AT), via=via)
    assert entry.value == pytest.approx(engine)
