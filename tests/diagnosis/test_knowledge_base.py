"""Every shipped rule: data that fires it and data that must not; the rule folder itself is valid;
`stethoscope diagnose` prints findings and exits by --fail-on."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

CATALOG = Catalog.load()
LOADED = load_rules(TOP / "rules", CATALOG)
RULES = {rule.rule_id: rule for rule in LOADED.rules}
AT = now_ms() - 30_000


HOUR = 3_600_000
DAY = 24 * HOUR


def put(store, node, device, **series):
    batch = MetricColumns()
    for metric, values in series.items():
        for index, value in enumerate(values):
            batch.append(node, metric, device, {}, float(value), AT - (len(values) - 1 - index) * 60_000)
    store.insert_metrics(batch)


CPUPOWER_FAILED = {"collector": "tuning", "tool": "cpupower", "rc": "1", "cause": "tool_failed"}


def S(metric, values, device="node", labels=None, step_ms=60_000):
    return (metric, device, labels or {}, values, step_ms)


def store_series(store, node, spec):
    metric, device, labels, values, step_ms = spec
    offsets = [(len(values) - 1 - index) * step_ms for index in range(len(values))]
    if metric.startswith("bench_"):
        store.insert_rows(
            "bench_results",
            [
                {
                    "run_id": f"{node}-{offset}",
                    "node_id": node,
                    "suite": "kb",
                    "metric_name": metric,
                    "device": device,
                    "labels": labels,
                    "value": float(value),
                    "unit": "",
                    "repetition": 0,
                    "class_fingerprint": "class",
                    "node_fingerprint": node,
                    "unstable": 0,
                    "timestamp": AT - offset,
                }
                for value, offset in zip(values, offsets, strict=True)
            ],
        )
        return
    batch = MetricColumns()
    for value, offset in zip(values, offsets, strict=True):
        batch.append(node, metric, device, labels, float(value), AT - offset)
    store.insert_metrics(batch)


SWEEP = 60_000  # the lab's sweep spacing (the catalog's 60 s)
STREAM = 5_000  # the job reporter's period
JOB = {"job": "bert-large-7f3a", "source": "stream"}


def noisy(center, spread, count, seed):
    """`count` samples around `center` within ± `spread` (a fraction), the same on every run."""
    rng = random.Random(seed)
    return [round(center * (1 + rng.uniform(-spread, spread)), 2) for _ in range(count)]


def counter(first, increments):
    """A cumulative counter as the collector stores it: its first real value, then each sweep's total."""
    values = [first]
    for increment in increments:
        values.append(values[-1] + increment)
    return values


def now_and_then(first, count, bumps):
    """A flat counter with an occasional +1 (at the sample indexes in `bumps`): healthy noise."""
    return counter(first, [1 if i in bumps else 0 for i in range(count - 1)])


def swing(center, amplitude, count, period=20, seed=0):
    """Temperature following the load: a sine of `period` sweeps around `center`, ± 0.5 C of noise."""
    rng = random.Random(seed)
    return [
        round(center + amplitude * math.sin(2 * math.pi * i / period) + rng.uniform(-0.5, 0.5), 1)
        for i in range(count)
    ]


def ramp(start, per_sweep, count, seed=0):
    rng = random.Random(seed)
    return [round(start + per_sweep * i + rng.uniform(-1, 1), 1) for i in range(count)]


WEEK_OF_SWEEPS = 7 * 24 * 60
# the seed's drive: 217 reallocated sectors in ~90 days, 2.4 a day, read every sweep
SEED_REALLOCATION = [20 + int(2.4 * i / 1440) for i in range(WEEK_OF_SWEEPS)]


def xid(code, counts, step_ms=60_000):
    return [S("gpu_xid_errors_total", counts, "gpu1", {"xid": str(code)}, step_ms)]


# The collector's shapes (plugins/module_utils/collect_gpu.py): a (gpu, xid) series appears with its
# first event at 1; one already in the log at the first read starts at 0 and comes with its old count.
FIRST_XID = [1, 1, 1]  # appeared inside the 15-minute window: one new event
AFTER_MARKING = [0, 0, 1]  # pre-existing at the first read, then one new event
SEEN_BEFORE = 10 * 60_000  # three samples 10 minutes apart: the series was there before the window
# the XIDs with a shipped rule (docs/reference/xid.md, section "What stethoscope does")
RULED_XIDS = (46, 48, 62, 63, 64, 74, 79, 92, 94, 95, 109, 119, 120, 136, 140, 143, 144, 145, 146, 149, 150)


def throttle(bits):
    return [S("gpu_throttle_reasons_active", [bits] * 3, "gpu0")]


def fleet(metric, mine, labels=None, device="node"):
    """The node's own series, and four peers of the same class at 100."""
    return [S(metric, [mine], device, labels, step_ms=HOUR)], [S(metric, [100], device, labels)] * 4


OOP = {"algo": "ring", "placement": "oop", "size": "8"}
FLAT_RUNS = [100, 101, 99, 100, 101, 99, 100]  # a week of daily runs at the node's own normal
AVG = {"algo": "ring", "size": "avg"}
SUSTAINED = {"mode": "sustained", "bs": "4k", "iodepth": "64", "runtime": "1800"}
FLEET = {
    "ib_mtu_mismatch",
    "net_mtu_mismatch",
    "allreduce_busbw_below_fleet",
    "gemm_below_fleet",
    "fio_iops_below_fleet",
    "rdma_bw_below_fleet",
    "rdma_latency_above_fleet",
    "rdma_pair_rc_retries_above_class",
    "fio_latency_above_fleet",
    "ssd_write_cliff_before_fleet",
}
# rule -> (series of the node that must fire it, series of the node that must not)
CASES = {
    "gpu_row_remap_pending": (
        [S("gpu_remapped_rows_pending", [0, 1], "gpu0")],
        [S("gpu_remapped_rows_pending", [1, 0], "gpu0")],
    ),
    "gpu_row_remap_failure": (
        [S("gpu_remapping_failure", [1], "gpu0")],
        [S("gpu_remapping_failure", [0, 0], "gpu0")],
    ),
    "gpu_uncorrectable_row_remaps": (
        [S("gpu_remapped_rows_uncorrectable", [512], "gpu3")],
        [S("gpu_remapped_rows_uncorrectable", [511], "gpu3")],
    ),
    "gpu_volatile_dbe": (
        [S("gpu_ecc_uncorrected_volatile_total", [0, 2], "gpu0")],
        [S("gpu_ecc_uncorrected_volatile_total", [0, 0], "gpu0")],
    ),
    "gpu_retired_pages_limit": (
        [S("gpu_retired_pages_total", [63], "gpu0", {"cause": "dbe"})],
        [S("gpu_retired_pages_total", [62], "gpu0", {"cause": "dbe"})],
    ),
    **{
        f"gpu_xid_{code}": (
            xid(code, FIRST_XID if code % 2 else AFTER_MARKING),
            xid(code, [1, 1, 1], SEEN_BEFORE) + xid(code + 1, [0, 0, 0]) + xid(13, [1, 2, 5]),
        )
        for code in RULED_XIDS
    },
    # the collector's rows (collect_gpu): a lost GPU named as its XID rows name it, SXids per switch
    "gpu_lost": (
        [S("gpu_lost_events_total", [0, 0, 1], "pci:0000:b3:00", {"reason": "fallen_off_bus"})],
        [S("gpu_lost_events_total", [0, 0, 1], "gpu1", {"reason": "init_failed"})],
    ),
    "gpu_init_failed": (
        [S("gpu_lost_events_total", [0, 0, 1], "gpu1", {"reason": "init_failed"})],
        [S("gpu_lost_events_total", [0, 0, 1], "gpu1", {"reason": "fallen_off_bus"})],
    ),
    "nvswitch_sxid_fatal": (
        [S("nvswitch_sxid_errors_total", [0, 0, 2], "nvswitch0", {"sxid": "20034", "severity": "fatal"})],
        [S("nvswitch_sxid_errors_total", [0, 1, 4], "nvswitch0", {"sxid": "12028", "severity": "nonfatal"})],
    ),
    "nvswitch_sxid_nonfatal": (
        [S("nvswitch_sxid_errors_total", [0, 1, 4], "nvswitch3", {"sxid": "12028", "severity": "nonfatal"})],
        [S("nvswitch_sxid_errors_total", [2, 2], "nvswitch3", {"sxid": "12028", "severity": "fatal"}, HOUR)],
    ),
    # its headline line lost: may be fatal, never read as a corrected one
    "nvswitch_sxid_unknown_severity": (
        [S("nvswitch_sxid_errors_total", [0, 1], "nvswitch2", {"sxid": "20034", "severity": "unknown"})],
        [S("nvswitch_sxid_errors_total", [0, 3], "nvswitch2", {"sxid": "12028", "severity": "nonfatal"})],
    ),
    # collector_failure.failure_rows: the cause's gauge on the device, collector_failed with its labels
    "collector_gpu_lost": (
        [S("collector_gpu_lost", [0, 0, 1], "gpu0", {"collector": "gpu", "tool": "nvidia-smi", "rc": "255"})],
        [S("collector_gpu_lost", [1, 0, 0], "gpu0", {"collector": "gpu", "tool": "nvidia-smi", "rc": "255"})],
    ),
    "collector_hca_missing": (
        [S("collector_hca_missing", [0, 1], "mlx5_1", {"collector": "rdma", "tool": "ibstat", "rc": "255"})],
        [S("collector_hca_missing", [1, 0], "mlx5_1", {"collector": "rdma", "tool": "ibstat", "rc": "255"})],
    ),
    "collector_disk_unreadable": (
        [
            S(
                "collector_disk_unreadable",
                [0, 1],
                "sdb",
                {"collector": "smart", "tool": "smartctl", "rc": "2"},
            )
        ],
        [
            S(
                "collector_disk_unreadable",
                [0, 0],
                "sdb",
                {"collector": "smart", "tool": "smartctl", "rc": "2"},
            )
        ],
    ),
    "collector_failed": (
        [S("collector_failed", [1], "tuning", CPUPOWER_FAILED)],
        [
            S(
                "collector_failed",
                [1],
                "gpu",
                {"collector": "gpu", "tool": "nvidia-smi", "rc": "255", "cause": "gpu_lost"},
            )
        ],
    ),
    "gpu_xid_preexisting": (
        [S("gpu_xid_preexisting_total", [2], "gpu1", {"xid": "79"}), *xid(79, [0])],
        xid(79, [0, 0, 0], SEEN_BEFORE),
    ),
    # the H200 under load holds its 700 W cap with SW power cap (0x4) and full clocks: healthy
    "gpu_thermal_throttling": (throttle(0x40 | 0x4), throttle(0x4)),
    "gpu_hw_power_brake": (throttle(0x80), throttle(0x4 | 0x1)),
    # HW slowdown alone is ambiguous (thermal or power brake); beside 0x40 its cause is named
    "gpu_hw_slowdown": (throttle(0x8 | 0x4), throttle(0x8 | 0x40)),
    "nvlink_physical_error": (
        [
            S("nvlink_error_rate_percent", [0.01] * 3, "gpu2/link3"),
            S("gpu_temperature_celsius", [50] * 3, "gpu2"),
        ],
        [
            S("nvlink_error_rate_percent", [0.01] * 3, "gpu2/link3"),
            S("gpu_temperature_celsius", [85] * 3, "gpu2"),
            # one CRC blip in a clean window on a cool GPU: noise, not a failing link
            S("nvlink_error_rate_percent", [0, 0.01, 0], "gpu5/link1"),
            S("gpu_temperature_celsius", [50] * 3, "gpu5"),
        ],
    ),
    "nvlink_replay_recovery_errors": (
        [S("nvlink_recovery_errors_total", [3, 3, 4], "gpu1/link0")],
        [
            S("nvlink_recovery_errors_total", [3, 3, 3], "gpu1/link0"),
            S("nvlink_replay_errors_total", [7, 7], "gpu1/link0"),
        ],
    ),
    "nvlink_link_down": (
        [S("nvlink_link_up", [0, 0, 0], "gpu0/link5")],
        [S("nvlink_link_up", [1, 0, 1], "gpu0/link5")],
    ),
    "ib_port_not_active": (
        [S("ib_port_state", [1, 1, 1], "mlx5_0/1")],
        [S("ib_port_state", [4, 1, 4], "mlx5_0/1")],
    ),
    "ib_symbol_errors": (
        [S("ib_symbol_errors_total", [0, 60, 121], "mlx5_0/1", step_ms=20 * 60_000)],
        [S("ib_symbol_errors_total", [1000, 1060, 1119], "mlx5_0/1", step_ms=20 * 60_000)],
    ),
    "ib_link_downed": (
        [S("ib_link_downed_total", [2, 2, 3], "mlx5_0/1")],
        [S("ib_link_downed_total", [255, 255, 255], "mlx5_0/1")],
    ),
    # a legacy counter rdma_facts labelled saturated=1 (no counters_ext twin); a 64-bit one at 255 counts on
    "ib_counter_saturated": (
        [S("ib_link_downed_total", [255] * 3, "mlx5_0/1", {"saturated": "1"})],
        [
            S("ib_link_downed_total", [254] * 3, "mlx5_0/1"),  # one short of the 8-bit limit: still counting
            S("ib_symbol_errors_total", [70_000] * 3, "mlx5_1/1"),  # a 64-bit counter is never saturated
            S("ib_port_xmit_discards_total", [65_535], "mlx5_2/1", {"saturated": "1"}),  # one sweep only
            S("ib_link_downed_total", [255, 255, 255], "mlx5_3/1"),  # unlabelled: a 64-bit twin at 255
        ],
    ),
    "ib_mtu_mismatch": fleet("ib_port_active_mtu", 50, device="mlx5_0/1"),
    "net_mtu_mismatch": fleet("net_mtu", 45, device="ib0"),
    "rdma_qp_queue_overflow": (
        [
            S("rdma_qps_dropped_per_second", [150, 180, 170, 160, 150], "mlx5_0/1"),
            S("ib_port_xmit_discards_total", [10, 10, 10, 10, 10], "mlx5_0/1"),
        ],
        [
            S("rdma_qps_dropped_per_second", [150, 180, 170, 160, 150], "mlx5_0/1"),
            S("ib_port_xmit_discards_total", [10, 300, 600, 700, 900], "mlx5_0/1"),
            # a few drops now and then on a busy port: normal
            S("rdma_qps_dropped_per_second", [0, 3, 0, 12, 0], "mlx5_1/1"),
            S("ib_port_xmit_discards_total", [4, 4, 4, 4, 4], "mlx5_1/1"),
        ],
    ),
    "rdma_qp_in_error": (
        [S("rdma_qp_error_count", [2, 2, 1], "mlx5_0/1")],
        [S("rdma_qp_error_count", [2, 0, 2], "mlx5_0/1")],
    ),
    "ssd_reallocated_sectors": (
        [
            S("smart_reallocated_sector_ct", [120], "sda"),
            S("smart_media_wearout_indicator_normalized", [8], "sda"),
        ],
        [
            S("smart_reallocated_sector_ct", [120], "sda"),
            S("smart_media_wearout_indicator_normalized", [55], "sda"),
        ],
    ),
    "ssd_reallocated_growth": (
        [S("smart_reallocated_sector_ct", [10, 12, 16], "sda", step_ms=14 * DAY)],
        [S("smart_reallocated_sector_ct", [4, 5, 7], "sda", step_ms=14 * DAY)],  # +75 % but only 7
    ),
    "nvme_critical_warning_media": (
        [S("nvme_critical_warning", [0, 4], "nvme0n1")],
        [S("nvme_critical_warning", [4, 2], "nvme0n1")],
    ),
    "nvme_critical_warning_temperature": (
        [S("nvme_critical_warning", [2], "nvme0n1")],
        [S("nvme_critical_warning", [2, 0], "nvme0n1")],
    ),
    # smartctl's verdicts and error counters (tests/diagnosis/test_storage_rules.py feeds them real captures)
    "smart_disk_failing": (
        [S("smart_health_passed", [1, 0], "sdb")],
        [S("smart_health_passed", [0, 1], "sdb"), S("smart_exit_status", [64], "sdc")],
    ),
    "smart_attribute_failing_now": (
        [S("smart_attribute_failing", [2], "sdb", {"attribute": "reallocated_sector_ct"})],
        [S("smart_attribute_failing", [1], "sdb", {"attribute": "airflow_temperature_cel"})],
    ),
    "smart_attribute_failed_in_past": (
        [S("smart_exit_status", [32], "sdb")],
        [
            S("smart_exit_status", [4], "sdb"),
            S("smart_attribute_failing", [0], "sdb", {"attribute": "spin_up_time"}),
        ],
    ),
    "smart_error_log_has_errors": (
        [S("smart_exit_status", [216], "sdb")],
        [S("smart_exit_status", [4], "sdb")],
    ),
    "smart_self_test_failed": (
        [S("smart_exit_status", [128], "sdb")],
        [S("smart_exit_status", [64], "sdb")],
    ),
    "nvme_media_errors_rising": (
        [S("nvme_media_errors_total", [0, 0, 3], "nvme0n1")],
        [S("nvme_media_errors_total", [7, 7, 7], "nvme0n1")],
    ),
    "sas_uncorrected_errors_rising": (
        [S("disk_uncorrected_errors_total", [535, 536], "sdb", {"operation": "write"})],
        [S("disk_uncorrected_errors_total", [535, 535], "sdb", {"operation": "write"})],
    ),
    "sas_grown_defects_rising": (
        [S("disk_grown_defects_total", [260, 263], "sdb")],
        [S("disk_grown_defects_total", [260, 260], "sdb")],
    ),
    "nvme_endurance_consumed": (
        [S("nvme_percentage_used", [101], "nvme0n1")],
        [S("nvme_percentage_used", [75], "nvme0n1")],
    ),
    "nvme_available_spare_low": (
        [S("nvme_available_spare_percent", [9], "nvme0n1")],
        [S("nvme_available_spare_percent", [100], "nvme0n1")],
    ),
    "pcie_aer_correctable_storm": (
        [S("pcie_aer_correctable_errors_total", [0, 300, 600], "0000:17:00.0", step_ms=5 * 60_000)],
        [S("pcie_aer_correctable_errors_total", [0, 200, 400], "0000:17:00.0", step_ms=5 * 60_000)],
    ),
    "pcie_aer_uncorrectable": (
        [S("pcie_aer_fatal_errors_total", [0, 1], "0000:17:00.0")],
        [
            S("pcie_aer_fatal_errors_total", [1, 1], "0000:17:00.0"),
            S("pcie_aer_nonfatal_errors_total", [3, 3], "0000:17:00.0"),
        ],
    ),
    "pcie_link_degraded": (
        [S("pcie_link_degraded", [1, 1, 1], "0000:17:00.0")],
        [S("pcie_link_degraded", [1, 1, 0], "0000:17:00.0")],
    ),
    "allreduce_latency_subhealth": (
        [S("bench_allreduce_latency_us", [100, 101, 99, 100, 120], labels=OOP, step_ms=4 * HOUR)],
        [S("bench_allreduce_latency_us", [100, 101, 99, 100, 110], labels=OOP, step_ms=4 * HOUR)],
    ),
    "allreduce_latency_creep": (
        [S("bench_allreduce_latency_us", [*FLAT_RUNS, 100, 102, 103, 105, 108], labels=OOP, step_ms=DAY)],
        [S("bench_allreduce_latency_us", [*FLAT_RUNS, 100, 108, 99, 107, 101], labels=OOP, step_ms=DAY)],
    ),
    "allreduce_busbw_below_fleet": fleet("bench_allreduce_busbw_gb_per_s", 70, AVG),
    "gemm_below_fleet": fleet("bench_gemm_tflops", 85, {"dtype": "bf16"}, device="gpu0"),
    "fio_iops_below_fleet": fleet("bench_fio_randread_iops", 60, device="nvme0n1"),
    # bench_compute's verdicts per GPU (cpu stand-ins are measured, the sibling rule judges GPUs only)
    "gpu_silent_data_corruption": (
        [S("bench_gemm_mismatch", [0, 1], "gpu3", {"dtype": "bf16"}, step_ms=HOUR)],
        [S("bench_gemm_mismatch", [0, 0], "gpu3", {"dtype": "bf16"}, step_ms=HOUR)],
    ),
    "gpu_slowest_sibling": (
        [S("bench_gemm_below_siblings_percent", [2, 19.6], "gpu3", {"mode": "burst"}, step_ms=HOUR)],
        [
            S("bench_gemm_below_siblings_percent", [2, 12], "gpu3", {"mode": "burst"}, step_ms=HOUR),
            S("bench_gemm_below_siblings_percent", [40], "cpu1", {"mode": "burst"}, step_ms=HOUR),
        ],
    ),
    # collect.yml's counter: 0 at the node's first reading, then one driver upgrade
    "hardware_changed_rebaseline": (
        [S("node_fingerprint_changes_total", [0, 0, 1])],
        [S("node_fingerprint_changes_total", [0, 0, 0])],
    ),
    "governor_not_performance_during_bench": (
        [S("cpu_governor_performance", [1, 0], labels={"phase": "bench"})],
        [
            S("cpu_governor_performance", [1, 1], labels={"phase": "bench"}),
            S("cpu_governor_performance", [0, 0]),
        ],
    ),
    "training_step_time_regression": (
        # the seed's BERT job: an hour at 120 ms, then 180 ms and staying there, loss variance high
        [
            S("train_loss_variance", noisy(0.08, 0.1, 960, 1), labels=JOB, step_ms=STREAM),
            S(
                "train_step_time_ms",
                noisy(120, 0.03, 720, 2) + noisy(180, 0.03, 240, 3),
                labels=JOB,
                step_ms=STREAM,
            ),
        ],
        # a steady job with normal noise and a slow checkpoint step every 10 minutes
        [
            S("train_loss_variance", noisy(0.08, 0.1, 960, 4), labels=JOB, step_ms=STREAM),
            S(
                "train_step_time_ms",
                [v * (2 if i % 120 == 0 else 1) for i, v in enumerate(noisy(120, 0.05, 960, 5))],
                labels=JOB,
                step_ms=STREAM,
            ),
        ],
    ),
    "ssd_reallocated_climbing": (
        [S("smart_reallocated_sector_ct", SEED_REALLOCATION, "sda", step_ms=SWEEP)],
        [
            S(
                "smart_reallocated_sector_ct",
                now_and_then(4, WEEK_OF_SWEEPS, {3000, 8000}),
                "sda",
                step_ms=SWEEP,
            )
        ],
    ),
    "pcie_aer_correctable_rising": (
        # 1 a minute, rising to 6 a minute over two hours: well under the storm's 32 a minute
        [
            S(
                "pcie_aer_correctable_errors_total",
                counter(1532, [1 + i // 20 for i in range(119)]),
                "0000:17:00.0",
                step_ms=SWEEP,
            )
        ],
        [
            S(
                "pcie_aer_correctable_errors_total",
                now_and_then(17, 120, {10, 50, 100}),
                "0000:17:00.0",
                step_ms=SWEEP,
            )
        ],
    ),
    "ib_symbol_errors_rising": (
        # 5, 10, 20, 30, 40 then 60 an hour: still under the 120 an hour limit
        [
            S(
                "ib_symbol_errors_total",
                counter(3, [r / 60 for r in (5, 10, 20, 30, 40, 60) for _ in range(60)][1:]),
                "mlx5_1/1",
                step_ms=SWEEP,
            )
        ],
        [S("ib_symbol_errors_total", now_and_then(12, 360, {30, 140, 200, 330}), "mlx5_1/1", step_ms=SWEEP)],
    ),
    "nvme_wear_climbing": (
        [S("nvme_percentage_used", [91] * 4000 + [92] * 6080, "nvme0n1", step_ms=SWEEP)],
        [S("nvme_percentage_used", [95] * WEEK_OF_SWEEPS, "nvme0n1", step_ms=SWEEP)],  # parked, not wearing
    ),
    "gpu_temperature_rising": (
        # under load at 72 C, cooling failing: +7 C an hour, still under the 89 C slowdown
        [S("gpu_temperature_celsius", ramp(72, 7 / 60, 120), "gpu3", step_ms=SWEEP)],
        [
            S("gpu_temperature_celsius", swing(71, 11, 120), "gpu3", step_ms=SWEEP),  # swings with the load
            S(
                "gpu_temperature_celsius", swing(83, 2, 120, period=15, seed=1), "gpu4", step_ms=SWEEP
            ),  # hot, steady
        ],
    ),
    "disk_temperature_rising": (
        [S("disk_temperature_celsius", ramp(52, 8 / 60, 120), "nvme0n1", step_ms=SWEEP)],
        [
            S("disk_temperature_celsius", swing(48, 9, 120), "nvme0n1", step_ms=SWEEP),
            S("disk_temperature_celsius", swing(63, 2, 120, period=15, seed=1), "nvme1n1", step_ms=SWEEP),
        ],
    ),
    # every health signal ruled (tests/diagnosis/test_every_signal_ruled.py): counters as the collectors
    # store them
    "gpu_retired_pages_pending": (
        [S("gpu_retired_pages_pending", [0, 1], "gpu0")],
        [S("gpu_retired_pages_pending", [1, 0], "gpu0")],
    ),
    "gpu_hbm_temperature_high": (
        [S("gpu_memory_temperature_celsius", [96, 97, 96, 98, 97], "gpu2")],
        [S("gpu_memory_temperature_celsius", [80, 85, 99, 84, 82], "gpu2")],  # one hot sample: not sustained
    ),
    "nvlink_crc_error_rate": (
        [S("nvlink_crc_errors_total", counter(1000, [7000] * 5), "gpu1/link2")],  # ~117/s
        [S("nvlink_crc_errors_total", counter(1000, [3000] * 5), "gpu1/link2")],  # 50/s
    ),
    "gpu_pcie_replay_rate": (
        [S("gpu_pcie_replay_errors_total", counter(20, [40] * 5), "gpu3")],  # 200 in 5 min
        [S("gpu_pcie_replay_errors_total", counter(20, [10] * 5), "gpu3")],
    ),
    "rdma_local_ack_timeouts": (
        [S("rdma_local_ack_timeout_errors_total", counter(10, [120] * 5), "mlx5_0/1")],  # 2/s
        [S("rdma_local_ack_timeout_errors_total", counter(10, [30] * 5), "mlx5_0/1")],  # 0.5/s
    ),
    "rdma_rnr_nak_retry_exceeded": (
        [S("rdma_rnr_nak_retry_errors_total", [4, 4, 4, 5], "mlx5_3/1")],
        [S("rdma_rnr_nak_retry_errors_total", [4, 4, 4, 4], "mlx5_3/1")],
    ),
    "ib_port_rcv_errors": (
        [S("ib_port_rcv_errors_total", counter(0, [900] * 5), "mlx5_1/1")],  # 15/s
        [S("ib_port_rcv_errors_total", counter(0, [60] * 5), "mlx5_1/1")],  # 1/s
    ),
    # the lab's node08 (tools/lab.py): ib0 at 4096 over a port whose active MTU is 2048
    "ipoib_mtu_above_port_mtu": (
        [S("ib_port_ipoib_mtu_excess_bytes", [2052] * 3, "mlx5_1/1", {"interface": "ib0"})],
        [
            S("ib_port_ipoib_mtu_excess_bytes", [0] * 3, "mlx5_0/1", {"interface": "ib0"}),
            S("ib_port_ipoib_mtu_excess_bytes", [0, 2052, 0], "mlx5_1/1", {"interface": "ib0"}),
        ],
    ),
    "numa_balancing_during_bench": (
        [S("numa_balancing_enabled", [0, 1], labels={"phase": "bench"})],
        [S("numa_balancing_enabled", [0, 0], labels={"phase": "bench"}), S("numa_balancing_enabled", [1, 1])],
    ),
    # values as smartctl reports them on the failing WD3200BEVT and the healthy PM883 (public/smartctl)
    "ata_uncorrectable_sectors": (
        [S("smart_current_pending_sector", [1], "sdb"), S("smart_reported_uncorrect", [84], "sdb")],
        [S("smart_current_pending_sector", [0], "sda"), S("smart_uncorrectable_error_cnt", [0], "sda")],
    ),
    "rdma_bw_below_fleet": fleet("bench_rdma_bw_gbit_per_s", 80, device="mlx5_0"),
    "rdma_latency_above_fleet": fleet("bench_rdma_latency_p99_us", 200, device="mlx5_0"),
    # a baseline pair's RC retries: 300 local ACK timeouts where its class's pairs count 100
    "rdma_pair_rc_retries_above_class": fleet("bench_rdma_rc_local_ack_timeouts", 300, device="mlx5_0"),
    "fio_latency_above_fleet": fleet("bench_fio_randread_latency_p99_us", 200, device="nvme0n1"),
    # bench_storage mode=sustained: the cliff at 5 minutes; peers without one within the 30-minute run
    "ssd_write_cliff_before_fleet": (
        [
            S("bench_fio_latency_jump_seconds", [300], "scratch.fio", SUSTAINED, step_ms=HOUR),
            S("bench_fio_latency_jumped", [1], "scratch.fio", SUSTAINED, step_ms=HOUR),
        ],
        [S("bench_fio_latency_jump_seconds", [1800], "scratch.fio", SUSTAINED)] * 4,
    ),
    "training_subhealth": (
        [
            S("train_loss_variance", [0.08] * 6),
            S("train_step_time_ms", [100, 150, 90, 160, 80, 170], step_ms=5_000),
        ],
        [
            S("train_loss_variance", [0.08] * 6),
            S("train_step_time_ms", [100, 104, 98, 101, 99, 102], step_ms=5_000),
        ],
    ),
}


def test_the_shipped_rules_are_valid_and_each_has_cases():
    # the stream's rules have cases of their own: tests/telemetry/test_telemetry_rules.py
    stream = {rule_id for rule_id in RULES if rule_id.startswith("stream_")}
    assert LOADED.errors == [] and set(RULES) - {"ib_switch_congestion"} - stream == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_fires_and_does_not(store, rule_id):
    firing, quiet = CASES[rule_id]
    for spec in firing:
        store_series(store, "bad", spec)
    for index, spec in enumerate(quiet):  # a fleet case's peers are nodes of their own
        store_series(store, f"peer{index}" if rule_id in FLEET else "good", spec)
    assert [m.node_id for m in evaluate(store, RULES[rule_id], AT)] == ["bad"]


def test_preexisting_xids_give_one_info_finding_per_node_and_no_critical(store):
    from stethoscope.diagnosis.findings import diagnose

    # a node's first read: three codes already in the log on gpu1, emitted at 0 with their old counts
    for code, count in (("48", 3), ("79", 1), ("13", 7)):
        store_series(store, "veteran", S("gpu_xid_errors_total", [0], "gpu1", {"xid": code}))
        store_series(store, "veteran", S("gpu_xid_preexisting_total", [count], "gpu1", {"xid": code}))
    findings = diagnose(store, LOADED.rules, AT)
    assert [(f["rule_id"], f["node_id"], f["device"], f["severity"]) for f in findings] == [
        ("gpu_xid_preexisting", "veteran", "gpu1", "info")
    ]


def test_switch_congestion_is_one_finding_about_the_switch(store):
    store.insert_rows(
        "nodes",
        [
            {"node_id": n, "slurm_name": n, "rack": "r1", "switch": sw, "groups": [], "updated_at": AT}
            for n, sw in [("a1", "leaf1"), ("a2", "leaf1"), ("b1", "leaf2"), ("b2", "leaf2")]
        ],
    )
    discarding = S("ib_port_xmit_discards_total", [0, 60_000, 120_000], "mlx5_0/1")
    for node in ("a1", "a2", "b1"):
        store_series(store, node, discarding)
    store_series(store, "b2", S("ib_port_xmit_discards_total", [0, 1, 2], "mlx5_0/1"))
    matches = evaluate(store, RULES["ib_switch_congestion"], AT)
    assert sorted((m.node_id, m.nodes) for m in matches) == [("b1", []), ("switch:leaf1", ["a1", "a2"])]


def test_diagnose_cli_json_and_exit_codes(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    with Store(dsn) as store:
        store.init_schema()
        put(store, "node04", "gpu0", gpu_remapped_rows_pending=[1])
    run = [
        sys.executable,
        "-m",
        "stethoscope.cli",
        "--dsn",
        dsn,
        "diagnose",
        "--json",
        "--at",
        str(AT / 1000),
    ]
    warning = subprocess.run(run, capture_output=True, text=True, cwd=TOP, check=False)
    assert warning.returncode == 0  # a warning is below the default --fail-on critical
    (finding,) = json.loads(warning.stdout)
    assert {k: finding[k] for k in ("rule_id", "node_id", "device", "severity", "level")} == {
        "rule_id": "gpu_row_remap_pending",
        "node_id": "node04",
        "device": "gpu0",
        "severity": "warning",
        "level": "L2",
    }
    assert set(finding) == {
        "finding_id",
        "rule_id",
        "node_id",
        "device",
        "severity",
        "confidence",
        "level",
        "first_seen",
        "message",
        "evidence",
        "actions",
    }
    assert finding["message"] == "node04 gpu0: row remap pending, schedule a GPU reset when idle"
    strict = subprocess.run(
        [*run, "--fail-on", "warning"], capture_output=True, text=True, cwd=TOP, check=False
    )
    assert strict.returncode == 1


def test_the_same_data_and_rules_give_the_same_findings(store):
    from stethoscope.diagnosis.findings import diagnose, printable

    for rule_id, (firing, _quiet) in CASES.items():
        for spec in firing:
            store_series(store, f"n_{rule_id}"[:40], spec)
    runs = [[printable(f) for f in diagnose(store, LOADED.rules, AT, CATALOG)] for _ in range(3)]
    assert len(runs[0]) >= len(CASES) - len(FLEET)  # fleet rules need peers; the rest fire
    assert runs[0] == runs[1] == runs[2]


EARLY_WARNINGS = {
    "ssd_reallocated_climbing": "ssd_reallocated_sectors",
    "pcie_aer_correctable_rising": "pcie_aer_correctable_storm",
    "ib_symbol_errors_rising": "ib_symbol_errors",
    "nvme_wear_climbing": "nvme_endurance_consumed",
    "gpu_temperature_rising": "gpu_thermal_throttling",
    "disk_temperature_rising": "nvme_critical_warning_temperature",
    "allreduce_latency_creep": "allreduce_latency_subhealth",
}


@pytest.mark.parametrize("early, hard", sorted(EARLY_WARNINGS.items()))
def test_each_early_warning_shares_a_family_with_its_hard_limit_and_states_its_lead(early, hard):
    warning, limit = RULES[early], RULES[hard]
    assert warning.family is not None and warning.family == limit.family
    assert warning.severity == "warning"
    assert "Expected lead: ~" in warning.description and "Early warning of " + hard in warning.description


def test_a_steady_slowdown_is_missed_by_the_spread_alone_and_caught_against_the_jobs_normal(store):
    """The reviewer's BERT case: 120 ms -> 180 ms and staying; no 5 minutes of it vary by 20 %."""
    for spec in CASES["training_step_time_regression"][0]:
        store_series(store, "bert", spec)
    assert evaluate(store, RULES["training_subhealth"], AT) == []
    (match,) = evaluate(store, RULES["training_step_time_regression"], AT)
    assert match.node_id == "bert" and 45 < match.values["train_step_time_ms"] < 55  # +50 %
