"""`stethoscope top`: the rollup-plus-partial-hours answer equals the raw-rows answer exactly."""

from __future__ import annotations

import json

import pytest

from stethoscope.catalog import Catalog
from stethoscope.cli.main import main
from stethoscope.report.top import HOUR_MS, Window, increase, top
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import iso, now_ms

MINUTE = 60_000
END = now_ms() // HOUR_MS * HOUR_MS - 2 * HOUR_MS + 17 * MINUTE  # mid-hour: partial hours at both ends
WINDOW = Window(END - 24 * HOUR_MS, END)
NODES = ("n1", "n2", "n3")
DEVICES = ("gpu0/link0", "gpu1/link0")


def fleet() -> MetricColumns:
    """Sweeps every 10 minutes from half an hour before the window to half an hour after it."""
    batch = MetricColumns()
    start = WINDOW.start_ms - 30 * MINUTE
    for n, node in enumerate(NODES):
        for d, dev in enumerate(DEVICES):
            counter = 1_000.0 * (n + 1) + d  # a counter starts at its first observed value
            for i in range(0, 26 * 6):
                at = start + i * 10 * MINUTE
                rate = float((i * 37 + n * 11 + d * 5) % 23) / 10  # many equal maxima
                if node == "n3" and at == WINDOW.start_ms - 10 * MINUTE:
                    rate = 99.0  # outside the window: must not count
                if node == "n2" and dev == DEVICES[1] and at == WINDOW.start_ms + 10 * MINUTE:
                    rate = 7.5  # the peak, in the partial hour at the start
                batch.append(node, "nvlink_error_rate_percent", dev, {}, rate, at)
                batch.append(node, "gpu_sm_clock_mhz", dev.split("/")[0], {}, 1980.0 - rate * 10, at)
                counter += (i % 7) * (n + 1)
                if node == "n1" and i in (60, 61 + 3):  # resets: one mid-hour, one more later
                    counter = float(i % 5)
                batch.append(node, "nvlink_crc_errors_total", dev, {"lane": "0"}, counter, at)
    return batch


@pytest.fixture
def loaded(store):
    rows = fleet()
    store.insert_metrics(rows)
    store.insert_metrics(rows)  # a replayed batch: the answer must not change
    return store


@pytest.mark.parametrize(
    "metric", ["nvlink_error_rate_percent", "gpu_sm_clock_mhz", "nvlink_crc_errors_total"]
)
def test_top_from_rollup_and_partial_hours_equals_top_from_raw_rows(loaded, metric):
    catalog = Catalog.load()
    hourly = loaded.query(f"SELECT count() FROM {loaded.database}.metrics_hourly")[0][0]
    assert hourly > 0
    from_rollup = top(loaded, catalog, metric, WINDOW, limit=10)
    from_raw = top(loaded, catalog, metric, WINDOW, limit=10, via="raw")
    assert from_rollup == from_raw
    assert len(from_rollup) == len(NODES)


def test_top_peak_outside_the_window_does_not_count_and_partial_hour_peak_does(loaded):
    entries = top(loaded, Catalog.load(), "nvlink_error_rate_percent", WINDOW, limit=1)
    assert [(e.node_id, e.device, e.value) for e in entries] == [("n2", DEVICES[1], 7.5)]
    assert entries[0].at == iso(WINDOW.start_ms + 10 * MINUTE)


def test_top_worse_direction_of_a_higher_is_better_gauge_is_its_minimum(loaded):
    entries = top(loaded, Catalog.load(), "gpu_sm_clock_mhz", WINDOW, limit=3)
    assert entries[0].value == 1980.0 - 75.0 and entries[0].node_id == "n2"
    assert [e.value for e in entries] == sorted(e.value for e in entries)


def test_counter_increase_counts_a_reset_as_new_increase():
    # raw samples 10, 15, reset to 2, 6: increase 5 + 2 + 4
    raw = [(t, v, v, v) for t, v in enumerate([10.0, 15.0, 2.0, 6.0])]
    assert increase(raw) == 11.0
    # a summary without a reset after a first raw sample: it rose from 12 to 20
    assert increase([raw[0], (1, 12.0, 20.0, 20.0)]) == 10.0


def test_a_reset_inside_an_hour_whose_last_value_is_its_maximum_counts_both_climbs(store):
    # 0, 3, 0, 4 inside one whole hour: its min, max and last (0, 4, 4) look like one climb of 4
    hour = WINDOW.start_ms // HOUR_MS * HOUR_MS + 3 * HOUR_MS
    batch = MetricColumns()
    for i, value in enumerate([0.0, 0.0, 3.0, 0.0, 4.0, 4.0]):
        batch.append(
            "n1", "nvlink_crc_errors_total", "gpu0/link0", {}, value, hour - MINUTE + i * 10 * MINUTE
        )
    store.insert_metrics(batch)
    catalog = Catalog.load()
    (from_raw,) = top(store, catalog, "nvlink_crc_errors_total", WINDOW, via="raw")
    (from_rollup,) = top(store, catalog, "nvlink_crc_errors_total", WINDOW)
    assert from_raw.value == 7.0
    assert from_rollup == from_raw


def test_a_moving_hour_whose_raw_rows_expired_still_counts_from_its_summary(store):
    # past the raw TTL (30 days; the rollup keeps 90) a climbing hour was dropped: undercounted
    hour = WINDOW.start_ms // HOUR_MS * HOUR_MS + 3 * HOUR_MS
    batch = MetricColumns()
    for i, value in enumerate([10.0, 12.0, 15.0]):
        batch.append(
            "n1", "nvlink_crc_errors_total", "gpu0/link0", {}, value, hour - 30 * MINUTE + i * 30 * MINUTE
        )
    store.insert_metrics(batch)
    db = store.database
    store.command(
        f"ALTER TABLE {db}.metrics DELETE WHERE timestamp >= fromUnixTimestamp64Milli({hour}) "
        f"AND timestamp < fromUnixTimestamp64Milli({hour + HOUR_MS}) SETTINGS mutations_sync = 1"
    )
    (entry,) = top(store, Catalog.load(), "nvlink_crc_errors_total", WINDOW)
    assert entry.value == 5.0  # 10 before it, 15 at its end: from its summary


def test_top_cli_json_with_device_glob_and_label_filter(store, tmp_dsn, capsys):
    store.insert_metrics(fleet())
    store.close()
    code = main(
        [
            "top",
            "nvlink_crc_errors_total",
            "--days",
            "1",
            "--limit",
            "2",
            "--device",
            "gpu1/*",
            "--label",
            "lane=0",
            "--json",
            "--dsn",
            store.dsn,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    entries = json.loads(out)
    assert len(entries) == 2 and {e["device"] for e in entries} == {"gpu1/link0"}
    assert entries[0]["rate_per_second"] > 0
    assert main(["top", "no_such_metric", "--dsn", store.dsn]) == 2
    assert main(["top", "nvlink_crc_errors_total", "--label", "lane", "--dsn", store.dsn]) == 2
