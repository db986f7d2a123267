"""The raw table is sorted metric first: a rule reads one metric on every node, and with node_id first
ClickHouse found its granules by a generic exclusion search over every mark of the day's parts, at
planning, on every query (16 ms a read at 200 nodes x 24 h, 125 ms at 2,000; a cycle makes about 80,
benchmarks/diagnosis_cycle.py). Metric first, the same read is a binary search."""

from __future__ import annotations

import pytest

from stethoscope.store.batch import MetricColumns

AT = 1_796_000_000_000


def search_algorithms(store, where: str, table: str = "metrics") -> list[str]:
    plan = store.query(f"EXPLAIN indexes = 1 SELECT node_id FROM {store.database}.{table} WHERE {where}")
    return [line.split(":", 1)[1].strip() for (line,) in plan if "Search Algorithm" in line]


def some_rows(store) -> None:
    batch = MetricColumns()
    for node in ("node01", "node02", "node03"):
        for metric in ("gpu_temperature_celsius", "ib_link_downed_total"):
            batch.append(node, metric, "gpu0", {}, 1.0, AT)
    store.insert_metrics(batch)


def test_a_rules_read_of_one_metric_on_every_node_finds_its_granules_by_binary_search(store):
    some_rows(store)
    assert search_algorithms(store, "metric_name = 'ib_link_downed_total'") == ["binary search"]


@pytest.mark.parametrize("rollup", ["metrics_hourly", "metrics_daily"])
def test_a_rules_read_of_one_metrics_rollup_finds_its_granules_by_binary_search(store, rollup):
    """The rollups too (an increase's whole hours, a window past the raw TTL): at 2,000 nodes x 24 h
    metric first took a cycle's rules from 17.8 to 14.1 CPU-seconds, by hand."""
    some_rows(store)
    assert search_algorithms(store, "metric_name = 'ib_link_downed_total'", rollup) == ["binary search"]


def test_rows_that_differ_only_in_node_stay_apart_whatever_the_key_order(store):
    some_rows(store)
    some_rows(store)  # sent again: one row each, in a FINAL read
    rows = store.query(f"SELECT node_id, metric_name FROM {store.database}.metrics FINAL")
    assert len(rows) == 6 and len(set(rows)) == 6
