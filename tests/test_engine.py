"""Rule evaluation in real embedded ClickHouse: aggregates, operators, labels, device patterns,
AND/OR nesting, device joins and windows."""

from __future__ import annotations

import textwrap

import pytest

from stethoscope.batch import MetricColumns
from stethoscope.catalog import Catalog
from stethoscope.engine import evaluate
from stethoscope.rules import load_rules
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
