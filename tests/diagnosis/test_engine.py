"""Rule evaluation in real embedded ClickHouse: aggregates, operators, labels, device patterns,
AND/OR nesting, device joins and windows."""

from __future__ import annotations

import textwrap

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

from conftest import FIXTURES

CATALOG = Catalog.load()
AT = now_ms() - 60_000


def rule(tmp_path, text):
    path = tmp_path / "rule.yml"
    path.write_text(textwrap.dedent(text))
    result = load_rules(path, CATALOG)
    assert result.errors == []
    return result.rules[0]


def series(store, node, metric, device, values, labels=None, step_ms=60_000):
    batch = MetricColumns()
    for index, value in enumerate(values):  # the last value is the newest, at AT
        batch.append(
            node, metric, device, labels or {}, float(value), AT - (len(values) - 1 - index) * step_ms
        )
    store.insert_metrics(batch)


def fired(store, r):
    return {(m.node_id, m.device): round(m.value, 6) for m in evaluate(store, r, AT)}


def simple(tmp_path, metric, operator, threshold, window="10m", **extra):
    fields = "".join(f", {k}: {v}" for k, v in extra.items())
    return rule(
        tmp_path,
        f"""
        rule_id: r
        description: test
        severity: warning
        trigger:
          - {{metric: {metric}, operator: "{operator}", threshold: {threshold}, window: {window}{fields}}}
        """,
    )


def test_seed_rule_fires_on_physical_errors_not_on_a_hot_gpu(store):
    (seed,) = load_rules(FIXTURES / "rules/seed_nvlink_physical_error.yml", CATALOG).rules
    series(store, "n1", "nvlink_error_rate_percent", "gpu2/link3", [0.01] * 5)
    series(store, "n1", "gpu_temperature_celsius", "gpu2", [50] * 5)
    series(store, "n1", "gpu_temperature_celsius", "gpu3", [95] * 5)  # another GPU: not joined
    series(store, "n2", "nvlink_error_rate_percent", "gpu0/link0", [0.01] * 5)
    series(store, "n2", "gpu_temperature_celsius", "gpu0", [85] * 5)
    series(store, "n3", "nvlink_error_rate_percent", "gpu1/link0", [0.0] * 5)
    series(store, "n3", "gpu_temperature_celsius", "gpu1", [40] * 5)
    (match,) = evaluate(store, seed, AT)
    assert (match.node_id, match.device, match.value) == ("n1", "gpu2/link3", 0.01)
    assert match.values == {"nvlink_error_rate_percent": 0.01, "gpu_temperature_celsius": 50.0}


@pytest.mark.parametrize(
    "aggregate, operator, threshold, expected",
    [
        ("avg", ">", 20, 25.0),
        ("max", ">=", 40, 40.0),
        ("min", "<", 15, 10.0),
        ("last", "==", 30, 30.0),
        ("p99", ">", 39, 39.7),
        ("stddev", ">", 1, 12.909944),
        ("cv", ">", 0.5, 0.516398),
    ],
)
def test_aggregates(tmp_path, store, aggregate, operator, threshold, expected):
    series(store, "n1", "gpu_power_watts", "gpu0", [10, 20, 40, 30])
    assert fired(store, simple(tmp_path, "gpu_power_watts", operator, threshold, aggregate=aggregate)) == {
        ("n1", "gpu0"): pytest.approx(expected, rel=1e-3)
    }


def test_delta_and_rate_survive_a_counter_reset(tmp_path, store):
    series(store, "n1", "ib_symbol_errors_total", "mlx5_0/1", [100, 150, 3, 53])  # reset after 150
    assert fired(store, simple(tmp_path, "ib_symbol_errors_total", ">", 90, aggregate="delta")) == {
        ("n1", "mlx5_0/1"): 103.0
    }
    rate = simple(tmp_path, "ib_symbol_errors_total", ">", 0.1, window="10m", aggregate="rate")
    assert fired(store, rate) == {("n1", "mlx5_0/1"): pytest.approx(103 / 600, rel=1e-4)}


def test_has_bits_labels_device_pattern_and_min_samples(tmp_path, store):
    series(store, "n1", "gpu_throttle_reasons_active", "gpu0", [0x4, 0x4])  # power cap: healthy
    series(store, "n2", "gpu_throttle_reasons_active", "gpu1", [0x40, 0x40])  # hw thermal slowdown
    thermal = simple(tmp_path, "gpu_throttle_reasons_active", "has_bits", 96, aggregate="last")
    assert fired(store, thermal) == {("n2", "gpu1"): 64.0}
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [1, 2], labels={"xid": "79"})
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [5, 9], labels={"xid": "13"})
    xid79 = simple(tmp_path, "gpu_xid_errors_total", ">", 0, aggregate="last", labels="{xid: '79'}")
    assert fired(store, xid79) == {("n1", "gpu0"): 2.0}
    series(store, "n3", "ib_port_state", "mlx5_0/1", [1, 1, 1])
    series(store, "n3", "ib_port_state", "mlx5_bond_0/1", [1, 1, 1])
    ports = simple(tmp_path, "ib_port_state", "!=", 4, aggregate="last", device='"mlx5_[0-9]*/1"')
    assert fired(store, ports) == {}  # the pattern is a glob: '[' is literal, so nothing matches
    ports = simple(tmp_path, "ib_port_state", "!=", 4, aggregate="last", device='"mlx5_0/*"', min_samples=3)
    assert fired(store, ports) == {("n3", "mlx5_0/1"): 1.0}
    assert fired(store, simple(tmp_path, "ib_port_state", "!=", 4, device='"mlx5_0/*"', min_samples=4)) == {}


def test_window_excludes_older_samples(tmp_path, store):
    series(store, "n1", "gpu_temperature_celsius", "gpu0", [99, 99, 99, 40, 40, 40, 40], step_ms=120_000)
    assert (
        fired(store, simple(tmp_path, "gpu_temperature_celsius", ">", 80, window="7m", aggregate="max")) == {}
    )
    assert fired(
        store, simple(tmp_path, "gpu_temperature_celsius", ">", 80, window="13m", aggregate="max")
    ) == {("n1", "gpu0"): 99.0}


def test_any_of_all_nesting_and_node_level_join(tmp_path, store):
    nested = rule(
        tmp_path,
        """
        rule_id: storage_or_numa
        description: a worn SSD, or NUMA balancing on while the governor is not performance
        severity: warning
        when:
          any:
            - {metric: nvme_percentage_used, operator: ">=", threshold: 80, window: 10m, aggregate: last}
            - all:
                - {metric: numa_balancing_enabled, operator: "==", threshold: 1, window: 10m, aggregate: last}
                - {metric: nvme_available_spare_percent, operator: "<", threshold: 50, window: 10m}
        """,
    )
    series(store, "n1", "nvme_percentage_used", "nvme0n1", [75, 81])
    series(store, "n2", "numa_balancing_enabled", "node", [1, 1])
    series(
        store, "n2", "nvme_available_spare_percent", "nvme0n1", [40, 40]
    )  # another device kind: joins on node
    series(store, "n3", "numa_balancing_enabled", "node", [1, 1])
    series(store, "n3", "nvme_available_spare_percent", "nvme0n1", [99, 99])
    assert set(fired(store, nested)) == {("n1", "nvme0n1"), ("n2", "node")}


def test_the_first_condition_speaks_for_the_match_though_the_costliest_is_read_first(tmp_path, store):
    # the 6-hour one is the costliest: it streams on the left of the join, the 5-minute one is built
    slowdown = rule(
        tmp_path,
        """
        rule_id: slow_and_noisy
        description: test
        severity: warning
        trigger:
          - {metric: train_loss_variance, operator: ">", threshold: 0.05, window: 5m}
          - {metric: train_step_time_ms, operator: ">", threshold: 20, window: 5m, baseline: node,
             history: 6h}
        """,
    )
    series(store, "n1", "train_step_time_ms", "node", [120] * 60 + [180] * 5)
    series(store, "n1", "train_loss_variance", "node", [0.2] * 5)
    series(store, "n2", "train_step_time_ms", "node", [120] * 60 + [180] * 5)  # steady loss: no match
    series(store, "n2", "train_loss_variance", "node", [0.01] * 5)
    (match,) = evaluate(store, slowdown, AT)
    assert (match.node_id, match.value) == ("n1", pytest.approx(0.2))
    assert match.values == {
        "train_loss_variance": pytest.approx(0.2),
        "train_step_time_ms": pytest.approx(50.0),
    }


def bench(store, node, metric, values, labels=None, cls="classA", step_ms=4 * 3_600_000):
    """One benchmark run per value, the newest at AT."""
    rows = [
        {
            "run_id": f"run{index}",
            "node_id": node,
            "suite": "nccl",
            "metric_name": metric,
            "device": "node",
            "labels": labels or {},
            "value": float(value),
            "unit": "us",
            "repetition": 0,
            "class_fingerprint": cls,
            "node_fingerprint": f"{node}-fp",
            "unstable": 0,
            "timestamp": AT - (len(values) - 1 - index) * step_ms,
        }
        for index, value in enumerate(values)
    ]
    store.insert_rows("bench_results", rows)


def test_node_baseline_deviation_in_the_worse_direction(tmp_path, store):
    slower = simple(
        tmp_path, "bench_allreduce_latency_us", ">", 14, window="3h", baseline="node", history="7d"
    )
    bench(store, "creeping", "bench_allreduce_latency_us", [100, 101, 99, 100, 120])
    bench(store, "faster", "bench_allreduce_latency_us", [100, 101, 99, 100, 70])
    bench(store, "steady", "bench_allreduce_latency_us", [100, 101, 99, 100, 105])
    bench(store, "new", "bench_allreduce_latency_us", [150])  # no history: no baseline, no finding
    assert fired(store, slower) == {("creeping", "node"): 20.0}


def test_node_baseline_percent_is_not_lifted_by_a_few_slow_warm_up_steps(tmp_path, store):
    """A job's first steps (compilation, data loader warm-up) take seconds; its normal is the median."""
    slower = simple(
        tmp_path, "bench_allreduce_latency_us", ">", 20, window="3h", baseline="node", history="7d"
    )
    bench(store, "warmed", "bench_allreduce_latency_us", [3000, 100, 101, 99, 100, 150])
    assert fired(store, slower) == {("warmed", "node"): 50.0}


def test_fleet_baseline_grades_one_slow_node_of_identical_peers(tmp_path, store):
    slow = simple(tmp_path, "bench_allreduce_busbw_gb_per_s", ">", 20, window="3h", baseline="fleet")
    for node, value in [("n1", 180), ("n2", 180), ("n3", 181), ("n4", 126), ("n5", 250)]:
        bench(store, node, "bench_allreduce_busbw_gb_per_s", [value])
    bench(store, "other_class", "bench_allreduce_busbw_gb_per_s", [50], cls="classB")
    assert fired(store, slow) == {("n4", "node"): 30.0}
    sigma = simple(
        tmp_path, "bench_allreduce_busbw_gb_per_s", ">", 3, window="3h", baseline="fleet", deviation="sigma"
    )
    assert set(fired(store, sigma)) == {("n4", "node")}


def test_trend_by_slope_and_rising_steps(tmp_path, store):
    rising = rule(
        tmp_path,
        """
        rule_id: warming
        description: temperature creeping up
        severity: warning
        trigger:
          - {metric: gpu_temperature_celsius, operator: ">", threshold: 10, window: 1h, aggregate: slope}
          - {metric: gpu_temperature_celsius, operator: ">=", threshold: 0.7, window: 1h,
             aggregate: rising_fraction}
        """,
    )
    series(store, "warming", "gpu_temperature_celsius", "gpu0", [40, 42, 44, 45, 47, 50, 52, 55])
    series(store, "spiky", "gpu_temperature_celsius", "gpu0", [40, 70, 40, 70, 40, 70, 40, 70])
    series(store, "flat", "gpu_temperature_celsius", "gpu0", [60] * 8)
    assert set(fired(store, rising)) == {("warming", "gpu0")}


def test_long_windows_read_the_daily_rollup(tmp_path, store):
    growth = simple(
        tmp_path, "smart_reallocated_sector_ct", ">", 50, window="35d", aggregate="growth_percent"
    )
    day = 86_400_000
    series(store, "growing", "smart_reallocated_sector_ct", "sda", [10, 12, 20], step_ms=16 * day)
    series(store, "stable", "smart_reallocated_sector_ct", "sda", [10, 10, 11], step_ms=16 * day)
    raw = store.query(
        f"SELECT count() FROM {store.database}.metrics WHERE metric_name = 'smart_reallocated_sector_ct'"
    )
    assert raw[0][0] < 6  # the 32-day-old samples are past the raw TTL; the rollup keeps them
    assert fired(store, growth) == {("growing", "sda"): 100.0}


def test_correlated_nodes_become_one_switch_finding(tmp_path, store):
    congested = rule(
        tmp_path,
        """
        rule_id: switch_congestion
        description: several nodes behind one switch wait to transmit
        severity: warning
        correlate: {by: switch, min_nodes: 2}
        trigger:
          - {metric: ib_port_xmit_wait_total, operator: ">", threshold: 1000, window: 10m, aggregate: delta}
        """,
    )
    store.insert_rows(
        "nodes",
        [
            {"node_id": n, "slurm_name": n, "rack": "r1", "switch": sw, "groups": [], "updated_at": AT}
            for n, sw in [("a1", "leaf1"), ("a2", "leaf1"), ("b1", "leaf2"), ("b2", "leaf2")]
        ],
    )
    for node in ("a1", "a2", "b1"):
        series(store, node, "ib_port_xmit_wait_total", "mlx5_0/1", [0, 5000, 10000])
    series(store, "b2", "ib_port_xmit_wait_total", "mlx5_0/1", [0, 1, 2])
    matches = {m.node_id: m for m in evaluate(store, congested, AT)}
    assert set(matches) == {"switch:leaf1", "b1"}
    assert matches["switch:leaf1"].nodes == ["a1", "a2"] and matches["b1"].device == "mlx5_0/1"


def test_labels_are_separate_series(tmp_path, store):
    xid = simple(tmp_path, "gpu_xid_errors_total", ">", 0, aggregate="delta")
    six_minutes = 6 * 60_000  # the first sample lies before the 10-minute window: no series is new
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [5, 5, 5], {"xid": "13"}, six_minutes)
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [1, 1, 1], {"xid": "79"}, six_minutes)
    assert fired(store, xid) == {}  # mixed together the two flat counters would look like resets
    series(store, "n2", "gpu_xid_errors_total", "gpu0", [1, 1, 2], {"xid": "79"}, six_minutes)
    assert fired(store, xid) == {("n2", "gpu0"): 1.0}


SIX_MINUTES = 6 * 60_000  # with a 10-minute window: the first of three samples lies before it


def test_increase_between_the_last_sample_before_the_window_and_the_first_inside_counts(tmp_path, store):
    series(store, "n1", "ib_symbol_errors_total", "mlx5_0/1", [100, 150, 150], step_ms=SIX_MINUTES)
    series(store, "n2", "ib_symbol_errors_total", "mlx5_0/1", [150, 150, 150], step_ms=SIX_MINUTES)
    delta = simple(tmp_path, "ib_symbol_errors_total", ">", 0, aggregate="delta")
    assert fired(store, delta) == {("n1", "mlx5_0/1"): 50.0}
    rate = simple(tmp_path, "ib_symbol_errors_total", ">", 0, aggregate="rate")
    assert fired(store, rate) == {("n1", "mlx5_0/1"): pytest.approx(50 / 600, rel=1e-4)}


def test_counter_reset_across_the_window_start_counts_the_new_value(tmp_path, store):
    series(store, "n1", "ib_symbol_errors_total", "mlx5_0/1", [100, 20, 30], step_ms=SIX_MINUTES)
    delta = simple(tmp_path, "ib_symbol_errors_total", ">", 0, aggregate="delta")
    assert fired(store, delta) == {("n1", "mlx5_0/1"): 30.0}  # restarted, counted 20, then 10 more


def test_increase_starts_from_the_daily_rollup_past_two_days_of_raw_rows(tmp_path, store):
    three_days = 3 * 86_400_000
    series(store, "n1", "ib_symbol_errors_total", "mlx5_0/1", [100, 160], step_ms=three_days)
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [1, 1], {"xid": "79"}, three_days)
    delta = simple(tmp_path, "ib_symbol_errors_total", ">", 0, aggregate="delta")
    assert fired(store, delta) == {("n1", "mlx5_0/1"): 60.0}
    xid = simple(tmp_path, "gpu_xid_errors_total", ">", 0, aggregate="delta")
    assert fired(store, xid) == {}  # seen three days ago: not a new series, not a new event


def test_increase_starts_from_a_sample_hours_before_the_window(tmp_path, store):
    five_hours = 5 * 3_600_000  # a gap longer than the hour searched first, shorter than two days
    series(store, "n1", "ib_symbol_errors_total", "mlx5_0/1", [100, 160], step_ms=five_hours)
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [1, 1], {"xid": "79"}, five_hours)
    delta = simple(tmp_path, "ib_symbol_errors_total", ">", 0, aggregate="delta")
    assert fired(store, delta) == {("n1", "mlx5_0/1"): 60.0}
    xid = simple(tmp_path, "gpu_xid_errors_total", ">", 0, aggregate="delta")
    assert fired(store, xid) == {}


def test_events_series_first_inside_the_window_counts_from_zero_a_counter_does_not(tmp_path, store):
    # the collector's shape: a (gpu, xid) series appears with the first event, at 1, and stays there
    series(store, "n1", "gpu_xid_errors_total", "gpu0", [1, 1, 1], labels={"xid": "79"})
    series(store, "n2", "ib_symbol_errors_total", "mlx5_0/1", [7, 7, 7])
    xid = simple(tmp_path, "gpu_xid_errors_total", ">", 0, aggregate="delta", labels="{xid: '79'}")
    assert fired(store, xid) == {("n1", "gpu0"): 1.0}
    counter = simple(tmp_path, "ib_symbol_errors_total", ">", 0, aggregate="delta")
    assert fired(store, counter) == {}  # a counter's first value is where it stood, not news


def test_replayed_rows_do_not_inflate_min_samples_or_rising_fraction(tmp_path, store):
    for _replay in range(2):  # the same rows stored twice (a spool replayed after a partial write)
        series(store, "n1", "ib_port_state", "mlx5_0/1", [1, 1])
        series(store, "n1", "gpu_temperature_celsius", "gpu0", [40, 41, 42, 43])
    ports = simple(tmp_path, "ib_port_state", "!=", 4, aggregate="last", min_samples=3)
    assert fired(store, ports) == {}
    rising = simple(tmp_path, "gpu_temperature_celsius", ">=", 0.9, aggregate="rising_fraction")
    assert fired(store, rising) == {("n1", "gpu0"): 1.0}
    stddev = simple(tmp_path, "gpu_temperature_celsius", ">", 0, aggregate="stddev")
    assert fired(store, stddev) == {("n1", "gpu0"): pytest.approx(1.290994, rel=1e-5)}
