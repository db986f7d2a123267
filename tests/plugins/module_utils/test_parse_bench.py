"""Benchmark output parsers on the public captures (nccl-tests, perftest, fio) and the H200's own."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import (
    bench_result,
    relative_stddev_percent,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fio_json import parse_fio_json
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fio_latency_log import (
    latency_jump,
    parse_lat_log,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nccl_tests import parse_nccl_tests
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import parse_query_gpu_csv
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.perftest import parse_perftest
from ansible_collections.aicluster.stethoscope.plugins.module_utils.suite_storage import cliff_values

from conftest import fixture_text


@pytest.mark.parametrize(
    "fixture, rows, average, wrong",
    [
        ("all_reduce_perf_8xA100-SXM4-80GB_nccl2.16.2_gcm.txt", 6, 210.99, 0),
        ("all_reduce_perf_2node_16xA100-SXM4-80GB_nccl2.12.12_gcm.txt", 6, 150.209, 0),
        # run with "validation: 0": #wrong is N/A, nothing was checked
        ("all_reduce_perf_8xA100-SXM4-40GB_superbench.txt", 34, 68.4048, None),  # no root, NCCL INFO lines
        ("all_gather_perf_superbench.txt", 34, 58.2651, None),  # no redop column
        ("all_gather_perf_2node_H200_gke_nccl2.25.1.txt", 24, 15.0709, 0),
    ],
)
def test_nccl_tests_tables(fixture, rows, average, wrong):
    parsed = parse_nccl_tests(fixture_text(f"public/nccl-tests/{fixture}"))
    assert len(parsed["rows"]) == rows and parsed["avg_busbw_gb_per_s"] == average
    assert parsed["wrong"] == wrong and parsed["validated"] is (wrong is not None) and not parsed["failed"]


def test_nccl_tests_8xa100_values():
    parsed = parse_nccl_tests(
        fixture_text("public/nccl-tests/all_reduce_perf_8xA100-SXM4-80GB_nccl2.16.2_gcm.txt")
    )
    last = parsed["rows"][-1]
    assert (last["size"], last["oop_time_us"], last["oop_busbw"], last["ip_busbw"]) == (
        1073741824,
        8109.1,
        231.72,
        231.70,
    )
    assert parsed["nccl_version"] == "2.16.2+cuda11.6"


def test_nccl_launch_failure_is_reported_as_such():
    parsed = parse_nccl_tests(
        fixture_text("public/nccl-tests/all_reduce_perf_mpirun_failure_not_enough_slots_gcm.txt")
    )
    assert parsed["failed"] and parsed["failure"].startswith("There are not enough slots available")


def test_nccl_wrong_results_are_counted():
    text = "    1048576    262144  float  sum  -1  50.0  20.97  36.70  3  50.1  20.93  36.63  0\n"
    assert parse_nccl_tests(text)["wrong"] == 3


def test_perftest_read_latency_with_cpu_frequency_warnings():
    parsed = parse_perftest(fixture_text("public/perftest/ib_read_lat_roce_cx5_mlx5_0_spiderpool.txt"))
    (row,) = parsed["rows"]
    assert parsed["kind"] == "lat" and (row["t_typical_us"], row["p99_us"], row["p999_us"]) == (
        7.04,
        7.38,
        16.81,
    )


def test_perftest_bandwidth_in_mb_and_gb():
    mb = parse_perftest(fixture_text("public/perftest/ib_write_bw_8M_loopback_superbench.txt"))
    assert mb["bw_unit"] == "MB/sec" and mb["rows"][-1]["bw_average_gbit_per_s"] == pytest.approx(
        201.8, abs=0.1
    )
    gb = parse_perftest(fixture_text("public/perftest/ib_write_bw_gpudirect_cuda_dmabuf_h200_gke.txt"))
    assert gb["bw_unit"] == "Gb/sec" and gb["rows"][-1]["bw_average_gbit_per_s"] == 140.4


def test_perftest_failed_status_is_a_failure():
    parsed = parse_perftest(fixture_text("public/perftest/ib_write_bw_roce_mlx5_3_FAILED_status10_gke.txt"))
    assert parsed["failed"] and parsed["failure"] == "Completion with error at client"


@pytest.mark.parametrize(
    "fixture, iops, p99",
    [
        ("fio-3.1_randread_4k_qd32_samsung_pm883_sata.json", 60015.983067, 634.88),
        ("fio-3.16_randrw_4k_nvme0n1_superbench.json", 85138.890741, 2244.608),  # lat_percentiles=1
        (
            "fio-3.20_randread_randwrite_4k_qd64_gtod_reduce_ceph_rbd_kubestr.json",
            982.05078,
            None,
        ),  # gtod_reduce
    ],
)
def test_fio_json(fixture, iops, p99):
    job = parse_fio_json(fixture_text(f"public/fio/{fixture}"))["jobs"][0]
    assert job["read"]["iops"] == iops and job["read"]["clat_us"]["p99"] == p99


def test_fio_notes_before_json_and_garbage():
    text = fixture_text("public/fio/fio-3.1_randread_4k_qd32_samsung_pm883_sata.json")
    assert parse_fio_json("note: both iodepth >= 1 and synchronous I/O engine are selected\n" + text)["jobs"]
    with pytest.raises(ParseError):
        parse_fio_json("fio: failed to open file\n")


def test_latency_cliff_120us_to_8ms():
    log = "".join(
        f"{t * 1000}, {120_000 if t < 1800 else 8_000_000}, 1, 4096, 0\n" for t in range(0, 2400, 10)
    )
    jump = latency_jump(parse_lat_log(log))
    assert jump["at_seconds"] == 1800 and jump["baseline_us"] == 120 and jump["after_us"] == 8000
    assert (
        latency_jump(parse_lat_log("".join(f"{t * 1000}, 120000, 1, 4096, 0\n" for t in range(100)))) is None
    )


PM883_WRITE_LOG = "public/fio/fio-3.1_randwrite_4k_qd32_samsung_pm883_sata_clat.1.log"


def test_real_write_latency_log_of_a_healthy_ssd_has_no_cliff():
    """fio 3.1's own log of 60 s of 4k random writes on a Samsung PM883 (250 ms averages): about
    500 us throughout, and its closing partial average (743 us) is no cliff."""
    points = parse_lat_log(fixture_text(PM883_WRITE_LOG))
    assert len(points) == 241 and points[0] == (0.25, 502.095) and points[-1] == (60.0, 743.161)
    assert latency_jump(points) is None
    assert cliff_values(None, 60) == [
        ("bench_fio_latency_jump_seconds", 60, "s"),
        ("bench_fio_latency_jumped", 0, "flag"),
    ]


def test_a_cliff_in_the_real_log_is_timed_from_its_start():
    """The PM883's log with every sample from 45 s on made 40 times slower (its 500 us to 20 ms,
    the shape of the seed's 120 us to 8 ms): the jump is found where the first slow 250 ms began."""
    lines = fixture_text(PM883_WRITE_LOG).splitlines()
    slowed = [
        ", ".join([f[0], str(int(f[1]) * 40 if int(f[0]) >= 45_000 else int(f[1])), *f[2:]])
        for f in (line.split(", ") for line in lines)
    ]
    jump = latency_jump(parse_lat_log("\n".join(slowed)))
    assert jump["at_seconds"] == 44.75
    assert jump["after_us"] == pytest.approx(40 * jump["baseline_us"], rel=0.05)
    assert cliff_values(jump, 60) == [
        ("bench_fio_latency_jump_seconds", 44.75, "s"),
        ("bench_fio_latency_jumped", 1, "flag"),
    ]


def test_query_gpu_csv_under_load_shows_the_power_cap():
    rows = parse_query_gpu_csv(fixture_text("real/h200-vm/under-load/query_gpu_timeseries_2hz.csv"))
    loaded = [r for r in rows if r["utilization.gpu"] == 100]
    assert loaded and all(r["clocks_event_reasons.active"] & 0x4 for r in loaded)
    assert max(r["power.draw"] for r in loaded) < 705  # at the 700 W cap


def test_repetition_stability_flags_a_spread_above_3_percent():
    steady = [
        {
            "metric_name": "bench_fio_randread_iops",
            "device": "nvme0n1",
            "labels": {},
            "value": v,
            "unit": "iops",
            "repetition": i,
        }
        for i, v in enumerate([100.0, 101.0, 99.5], start=1)
    ]
    noisy = [dict(m, device="nvme1n1", value=v) for m, v in zip(steady, [100.0, 92.0, 108.0], strict=True)]
    bench, rows, stability = bench_result(
        "storage", steady + noisy, {"class_fingerprint": "c", "node_fingerprint": "n"}
    )
    flags = {s["device"]: s["unstable"] for s in stability}
    assert flags == {"nvme0n1": False, "nvme1n1": True}
    assert {r["device"]: r["value"] for r in rows} == {"nvme0n1": 100.0, "nvme1n1": 100.0}
    assert bench["repetitions"] == 3 and all(
        r["unstable"] for r in bench["results"] if r["device"] == "nvme1n1"
    )
    assert relative_stddev_percent([100.0, 92.0, 108.0]) == pytest.approx(8.0)
