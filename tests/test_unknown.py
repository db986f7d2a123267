"""UNKNOWN: a metric that stops arriving for 3 of its intervals, a node that stops altogether; never a
metric the node never had, a training job that ended, or a benchmark's one-off rows."""

from __future__ import annotations

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.unknown import DEVICE_RULE, NODE_RULE, silences
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

AT = now_ms()
MINUTE = 60_000


def put(store, node, metric, device, minutes_ago, labels=None):
    batch = MetricColumns()
    for ago in minutes_ago:
        batch.append(node, metric, device, labels or {}, 1.0, AT - ago * MINUTE)
    store.insert_metrics(batch)


def test_a_metric_that_stops_is_unknown_and_a_silent_node_is_one_finding(store):
    for node in ("healthy", "lost_gpu", "silent"):
        put(store, node, "gpu_temperature_celsius", "gpu0", [20, 10, 1] if node != "silent" else [30, 20, 10])
        put(store, node, "ib_port_state", "mlx5_0/1", [20, 10, 1] if node != "silent" else [30, 20, 10])
    put(store, "lost_gpu", "gpu_temperature_celsius", "gpu1", [20, 10, 5])  # 5 min > 3 x 60 s
    put(store, "healthy", "train_step_time_ms", "node", [20, 10])  # the job ended
    put(store, "healthy", "cpu_governor_performance", "node", [30], labels={"phase": "bench"})
    put(store, "silent", "bench_gemm_tflops", "gpu0", [1])  # a benchmark is no sign of life
    put(store, "healthy", "gpu_power_watts", "gpu0", [26 * 60])  # older than the 24 h look-back
    found = {(s.rule_id, s.node_id, s.device): s for s in silences(store, Catalog.load(), AT)}
    assert set(found) == {(DEVICE_RULE, "lost_gpu", "gpu1"), (NODE_RULE, "silent", "")}
    assert found[(DEVICE_RULE, "lost_gpu", "gpu1")].metrics == ["gpu_temperature_celsius"]
    assert sorted(found[(NODE_RULE, "silent", "")].metrics) == ["gpu_temperature_celsius", "ib_port_state"]
    assert found[(NODE_RULE, "silent", "")].last_seen_ms == AT - 10 * MINUTE


def test_the_inventory_sweep_interval_moves_the_unknown_line(store):
    put(store, "n1", "gpu_temperature_celsius", "gpu0", [14, 9])  # swept every 5 min: 9 min is fine
    put(store, "n1", "ib_port_state", "mlx5_0/1", [14, 9])
    assert {s.rule_id for s in silences(store, Catalog.load(), AT)} == {NODE_RULE}
    assert silences(store, Catalog.load().with_intervals(300), AT) == []
