"""The model's input read from a real embedded store: episodes written as the collector writes stream
rows come back as the same arrays; gaps are masked, not zero-filled; swept nodes are resampled."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from stethoscope.model.features import normalise, read_windows
from stethoscope.model.metadata import FEATURES, STEPS, ModelMeta, Normalisation
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope_training import episodes

F = {f.metric: i for i, f in enumerate(FEATURES)}
END_MS = (int(time.time()) // 60) * 60_000 - 60_000


class CountingStore(Store):
    """The real store, counting the metric queries read_windows sends."""

    metric_queries = 0

    def query_arrow(self, sql, parameters=None, settings=None):
        self.metric_queries += 1
        return super().query_arrow(sql, parameters, settings)


@pytest.fixture(scope="module")
def data() -> episodes.Episodes:
    return episodes.generate(seed=11, per_family=12)


def _pick(data: episodes.Episodes) -> list[int]:
    """An idle node, a training node, one of each fault class, and a node with lost samples."""
    chosen = [
        int(np.flatnonzero(data.family == f)[0])
        for f in (
            "healthy.idle",
            "healthy.job_transition",
            "communication.allreduce_centre",
            "storage.slow_nvme_clean_smart",
            "compute.straggler_gpu",
        )
    ]
    node_gaps = (data.mask[:, :, F["gpu_power_watts"]] == 0).any(axis=1)
    chosen.append(int(np.flatnonzero(node_gaps & (data.label > 0))[0]))
    return chosen


def _insert(store: Store, rows: list[dict]) -> None:
    store.insert_metrics(MetricColumns.from_rows(rows))


def test_episodes_written_as_stream_rows_read_back_as_the_same_arrays_in_one_query(data, tmp_dsn):
    picked = _pick(data)
    with CountingStore(tmp_dsn, "t_features") as store:
        store.init_schema()
        rows = []
        for n, i in enumerate(picked):
            rows += data.to_rows(i, f"node{n:02d}", END_MS)
        _insert(store, rows)
        store.metric_queries = 0
        windows = read_windows(store, END_MS)
        assert store.metric_queries == 1
    assert windows.node_ids == [f"node{n:02d}" for n in range(len(picked))]
    np.testing.assert_array_equal(windows.mask, data.mask[picked])
    np.testing.assert_allclose(windows.x, data.x[picked], rtol=1e-6, equal_nan=True)
    assert windows.job[0] == "" and windows.job[2] == str(700000 + picked[2])
    assert windows.hw_class == [""] * len(picked)  # no class fingerprint stored


def test_a_lost_stretch_of_samples_is_masked_not_zero_filled(data, store):
    i = int(np.flatnonzero(data.family == "healthy.training")[0])
    rows = [
        r
        for r in data.to_rows(i, "node01", END_MS)
        if not END_MS - 400_000 < r["timestamp"] <= END_MS - 300_000  # 100 s gone
    ]
    _insert(store, rows)
    windows = read_windows(store, END_MS, nodes=["node01", "node-without-rows"])
    power = windows.mask[0, :, F["gpu_power_watts"]]
    lost = [k for k in range(STEPS) if power[k] == 0]
    assert len(lost) == 20 - 2  # 20 steps without a sample, the first two carried (hold 15 s)
    assert np.isnan(windows.x[0, lost, F["gpu_power_watts"]]).all()
    assert (windows.mask[1] == 0).all() and np.isnan(windows.x[1]).all()
    assert windows.node_ids == ["node01", "node-without-rows"]


def _sweep_row(node, name, device, value, ts, labels=None):
    return {
        "node_id": node,
        "metric_name": name,
        "device": device,
        "labels": labels or {},
        "value": float(value),
        "timestamp": ts,
    }


def test_a_swept_node_is_resampled_with_its_holds_and_counters_become_rates(store):
    rows = []
    sweeps = [END_MS - 590_000 + 60_000 * s for s in range(8)]  # every 60 s, the last 170 s ago
    for s, ts in enumerate(sweeps):
        for gpu in range(2):
            rows.append(_sweep_row("swept", "gpu_temperature_celsius", f"gpu{gpu}", 40 + s + 10 * gpu, ts))
            rows.append(_sweep_row("swept", "gpu_power_watts", f"gpu{gpu}", 100 + gpu, ts))
            rows.append(_sweep_row("swept", "gpu_utilization_percent", f"gpu{gpu}", 50 + 50 * gpu, ts))
            rows.append(_sweep_row("swept", "gpu_sm_clock_mhz", f"gpu{gpu}", 1980 - 500 * gpu, ts))
        rows.append(_sweep_row("swept", "pcie_aer_correctable_errors_total", "0000:17:00.0", 600 * s, ts))
    _insert(store, rows)
    windows = read_windows(store, END_MS)
    x, mask = windows.x[0], windows.mask[0]
    step_of = [STEPS - 1 - (END_MS - ts) // 5000 for ts in sweeps]
    temp = x[:, F["gpu_temperature_celsius"]]
    assert temp[step_of[3]] == 53  # the hotter GPU of the fourth sweep (max over devices)
    assert temp[step_of[3] + 11] == 53 and temp[step_of[4]] == 54  # carried until the next sweep
    assert temp[step_of[7] + 17] == 57  # carried 85 s after the last: under 1.5 x the 60-s interval
    assert x[step_of[3] + 11, F["gpu_power_watts"]] == 201  # the sum over the GPUs
    assert x[step_of[3], F["gpu_utilization_percent"]] == 75  # their average
    assert x[step_of[3], F["gpu_sm_clock_mhz"]] == 1480  # the slowest
    assert mask[step_of[7] + 19, F["gpu_temperature_celsius"]] == 0  # 95 s after the last sweep
    aer = x[:, F["pcie_aer_correctable_errors_per_second"]]
    assert aer[step_of[1]] == pytest.approx(10.0)  # 600 errors over 60 s
    assert mask[: step_of[1], F["pcie_aer_correctable_errors_per_second"]].sum() == 0  # first: no rate
    assert mask[:, F["train_step_time_ms"]].sum() == 0


def test_stream_rows_win_over_the_sweeps_for_the_same_node(data, store):
    i = int(np.flatnonzero(data.family == "healthy.training")[0])
    rows = data.to_rows(i, "node01", END_MS)
    rows.append(_sweep_row("node01", "gpu_power_watts", "gpu0", 1.0, END_MS - 2_000))
    _insert(store, rows)
    windows = read_windows(store, END_MS)
    np.testing.assert_allclose(windows.x[0], data.x[i], rtol=1e-6, equal_nan=True)


def test_hw_class_is_the_class_fingerprints_gpu_model(data, store):
    i = int(np.flatnonzero(data.family == "healthy.idle")[0])
    _insert(store, data.to_rows(i, "node01", END_MS) + data.to_rows(i, "node02", END_MS))
    detail = {"gpu": {"models": ["NVIDIA H200"], "count": 8}}
    store.insert_rows(
        "fingerprints",
        [
            {
                "fingerprint": "abc",
                "kind": "class",
                "node_id": "node01",
                "detail": json.dumps(detail),
                "first_seen": END_MS - 86_400_000,
            }
        ],
    )
    windows = read_windows(store, END_MS)
    assert windows.hw_class == ["NVIDIA H200", ""]


def _meta(mean_default: float, mean_class: float) -> ModelMeta:
    width = len(FEATURES)
    return ModelMeta(
        name="t",
        features=list(FEATURES),
        normalisation={
            "default": Normalisation([mean_default] * width, [2.0] * width),
            "NVIDIA H200": Normalisation([mean_class] * width, [2.0] * width),
        },
        thresholds={},
    )


def test_normalise_uses_the_nodes_class_log1p_where_said_and_zero_where_masked():
    x = np.full((2, STEPS, len(FEATURES)), 3.0, dtype=np.float32)
    mask = np.ones_like(x)
    x[0, 5, :], mask[0, 5, :] = np.nan, 0
    out = normalise(x, mask, _meta(1.0, 0.0), ["NVIDIA H200", "unknown GPU"])
    assert out.dtype == np.float32 and not np.isnan(out).any()
    assert (out[0, 5] == 0).all()
    assert out[0, 0, F["gpu_power_watts"]] == pytest.approx(1.5)  # (3 - 0) / 2, its class
    assert out[1, 0, F["gpu_power_watts"]] == pytest.approx(1.0)  # (3 - 1) / 2, the default
    assert out[1, 0, F["train_step_time_ms"]] == pytest.approx((np.log1p(3.0) - 1) / 2)
