"""Benchmark modules run by Ansible: PyTorch on the CPU, fio for real on a temp file, nccl-tests and
perftest from recorded output at the process boundary; fingerprints; repetition stability."""

from __future__ import annotations

import shutil
import statistics

import pytest

from conftest import FIXTURES, REAL, fake_tools, run_module

torch = pytest.importorskip(
    "torch", reason="the CPU build of torch==2.13.0 is a dev dependency (make test installs it)"
)


def real_fio(tmp_path):
    """A tool folder holding only the system's fio: the module runs the real one."""
    system = tmp_path / "system-bin"
    system.mkdir()
    (system / "fio").symlink_to(shutil.which("fio"))
    return system


SMALL = {
    "allow_cpu": True,
    "size": 128,
    "fp64_size": 64,
    "iterations": 5,
    "warmup": 1,
    "repetitions": 3,
    "sustained_seconds": 1,
    "fft_points": 4096,
    "dtypes": ["fp32", "bf16"],
}


def test_compute_measures_every_standin_device_at_once(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    fingerprint = {"class_fingerprint": "c0ffee", "node_fingerprint": "beef", "detail": {"gpu": None}}
    result = run_module(
        tmp_path, "bench_compute", {**SMALL, "cpu_standins": 3, "fingerprint": fingerprint}, empty
    )
    assert not result["failed"], result.get("msg")
    assert result["device"] == "3 x CPU stand-in"
    bench = result["stethoscope_bench"]
    assert (
        bench["suite"] == "compute" and bench["class_fingerprint"] == "c0ffee" and bench["repetitions"] == 3
    )
    gemm = [r for r in bench["results"] if r["metric_name"] == "bench_gemm_tflops"]
    assert {r["device"] for r in gemm} == {"cpu0", "cpu1", "cpu2"}
    assert {(r["labels"]["gpu"], r["labels"]["standin"]) for r in gemm} == {
        ("0", "cpu"),
        ("1", "cpu"),
        ("2", "cpu"),
    }
    modes = {(r["labels"]["dtype"], r["labels"]["mode"]) for r in gemm}
    assert modes == {("fp32", "burst"), ("bf16", "burst"), ("bf16", "sustained")}
    assert all(r["value"] > 0 for r in gemm)
    names = {s["metric_name"] for s in result["stability"]}
    assert {"bench_gemm_tflops", "bench_fft_ms", "bench_gemm_mismatch", "bench_gemm_checksum"} <= names
    assert "bench_gemm_below_siblings_percent" in names  # every device against its siblings' median
    for device in result["devices"]:
        assert [c["ok"] for c in device["checks"]] == [True, True], device
        assert device["quorum"] == {"fp32": "agrees", "bf16": "agrees"}
        assert device["sustained"]["gemms"] > 0 and device["clock_event_reasons"] == []
    checksums = {
        (r["labels"]["dtype"], r["value"])
        for r in bench["results"]
        if r["metric_name"] == "bench_gemm_checksum"
    }
    assert len(checksums) == 2  # one per dtype: the three devices agree bit for bit


def test_a_corrupted_product_fails_that_device_only(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    args = {**SMALL, "repetitions": 1, "sustained_seconds": 0, "fft_points": 0, "cpu_standins": 3}
    result = run_module(tmp_path, "bench_compute", {**args, "inject_error_device": 1}, empty)
    assert result["failed"] and "cpu1: GEMM result differs from the reference" in result["msg"]
    by_device = {d["device"]: d for d in result["devices"]}
    assert [c["ok"] for c in by_device["cpu1"]["checks"]] == [False, False]
    assert all(c["ok"] for d in ("cpu0", "cpu2") for c in by_device[d]["checks"])
    assert by_device["cpu1"]["quorum"] == {"fp32": "odd one out", "bf16": "odd one out"}
    assert by_device["cpu0"]["quorum"] == {"fp32": "agrees", "bf16": "agrees"}
    flags = {
        (r["metric_name"], r["device"]): r["value"]
        for r in result["stethoscope_bench"]["results"]
        if r["metric_name"] in ("bench_gemm_mismatch", "bench_gemm_quorum_suspect")
        and r["labels"]["dtype"] == "fp32"
    }
    assert flags == {
        ("bench_gemm_mismatch", "cpu0"): 0.0,
        ("bench_gemm_mismatch", "cpu1"): 1.0,
        ("bench_gemm_mismatch", "cpu2"): 0.0,
        ("bench_gemm_quorum_suspect", "cpu0"): 0.0,
        ("bench_gemm_quorum_suspect", "cpu1"): 1.0,
        ("bench_gemm_quorum_suspect", "cpu2"): 0.0,
    }


def test_compute_without_gpu_is_skipped_with_the_reason(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    result = run_module(tmp_path, "bench_compute", {"allow_cpu": False}, empty)
    assert result["skipped"] and "no CUDA GPU visible to PyTorch and allow_cpu is false" in result["stdout"]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio (Debian package) is installed by .ci/run")
def test_storage_runs_fio_for_real_three_times(tmp_path):
    system = real_fio(tmp_path)
    result = run_module(
        tmp_path,
        "bench_storage",
        {
            "filename": str(tmp_path / "scratch.fio"),
            "size": "32M",
            "runtime": 2,
            "repetitions": 3,
            "state_dir": str(tmp_path / "s"),
        },
        system,
    )
    assert not result["failed"], result.get("msg")
    iops = [
        r["value"]
        for r in result["stethoscope_bench"]["results"]
        if r["metric_name"] == "bench_fio_randread_iops"
    ]
    assert len(iops) == 3 and min(iops) > 0
    (stability,) = [s for s in result["stability"] if s["metric_name"] == "bench_fio_randread_iops"]
    assert stability["rsd_percent"] == pytest.approx(
        statistics.stdev(iops) / statistics.mean(iops) * 100, abs=0.01
    )
    assert stability["unstable"] == (stability["rsd_percent"] > 3.0)
    print(f"fio randread RSD over 3 runs: {stability['rsd_percent']:.2f} %")  # reported in the closing note


def test_fio_may_run_its_whole_runtime(tmp_path):
    """fio runs for `runtime` by design: its limit is longer than the modules' `timeout` (their default of
    30 s would kill any fio run of the role's default length), with room to lay out the file: a fio of
    `runtime` 1 s that takes 7 s under a `timeout` of 1 s is not killed."""
    bindir, log = tmp_path / "bin", tmp_path / "tools.log"
    capture = FIXTURES / "public/fio/fio-3.1_randread_4k_qd32_samsung_pm883_sata.json"
    fake_tools(bindir, log, {"fio": f'sleep 7; cat "{capture}"'})
    args = {"filename": str(tmp_path / "scratch.fio"), "runtime": 1, "repetitions": 1, "timeout": 1}
    result = run_module(tmp_path, "bench_storage", args, bindir)
    assert not result["failed"], result.get("msg")
    assert result["stethoscope_metrics"]


def test_nccl_ring_and_tree_from_recorded_output(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(
        bindir,
        log,
        {
            "all_reduce_perf": 'echo "NCCL_ALGO=$NCCL_ALGO" >&2; cat '
            + str(
                REAL.parent.parent / "public/nccl-tests/all_reduce_perf_8xA100-SXM4-80GB_nccl2.16.2_gcm.txt"
            )
        },
    )
    result = run_module(
        tmp_path,
        "bench_nccl",
        {"repetitions": 2, "args": ["-b", "32M", "-e", "1G", "-f", "2"], "gpus_per_node": 8},
        bindir,
    )
    assert log.read_text().splitlines() == ["all_reduce_perf -b 32M -e 1G -f 2 -g 8"] * 4
    rows = {
        (
            r["name"],
            r["labels"]["algo"],
            r["labels"]["size"],
            r["labels"].get("placement"),
            r["labels"]["stat"],
        ): r["value"]
        for r in result["stethoscope_metrics"]
    }
    assert rows[("bench_allreduce_busbw_gb_per_s", "ring", "avg", None, "median")] == 210.99
    assert rows[("bench_allreduce_latency_us", "tree", "1073741824", "oop", "max")] == 8109.1
    assert rows[("bench_allreduce_latency_us", "tree", "1073741824", "ip", "max")] == 8109.7
    assert {r["algo"] for r in result["runs"]} == {"Ring", "Tree"}


def test_nccl_launch_failure_fails_the_task(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fixture = REAL.parent.parent / "public/nccl-tests/all_reduce_perf_mpirun_failure_not_enough_slots_gcm.txt"
    fake_tools(bindir, log, {"all_reduce_perf": f"cat {fixture}; exit 1"})
    result = run_module(tmp_path, "bench_nccl", {"repetitions": 1, "gpus_per_node": 8}, bindir)
    assert result["failed"] and "launch failed: There are not enough slots available" in result["msg"]


def test_network_failed_status_fails_the_task(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fixture = REAL.parent.parent / "public/perftest/ib_write_bw_roce_mlx5_3_FAILED_status10_gke.txt"
    fake_tools(bindir, log, {"ib_write_bw": f"cat {fixture}; exit 1"})
    result = run_module(
        tmp_path,
        "bench_network",
        {"server": "10.1.2.3", "peer": "node02", "tests": ["ib_write_bw"], "rdma_device": "mlx5_3"},
        bindir,
    )
    assert result["failed"] and "ib_write_bw to node02: Completion with error at client" in result["msg"]
    assert log.read_text().splitlines() == ["ib_write_bw -d mlx5_3 -s 2 -n 1000 -F --report_gbits 10.1.2.3"]


def root_with_hca_and_sata_disk(tmp_path):
    """The real H200 VM root, plus mlx5_0 of the real gpud H100 sysfs capture with a node GUID (from the
    real ibstat capture of such a node; the sysfs capture has none), a VPD that is not VPD, and a
    SATA disk whose vpd_pg80 holds its serial."""
    root = tmp_path / "root"
    shutil.copytree(REAL / "root", root)
    hca = root / "sys/class/infiniband/mlx5_0"
    shutil.copytree(REAL.parent.parent / "public/sysfs/sys-class-infiniband-h100_gpud/mlx5_0", hca)
    (hca / "node_guid").write_text("a088:c203:00e3:142a\n")
    (hca / "device").mkdir()
    (hca / "device/vpd").write_bytes(b"\xff" * 64)  # an unprogrammed VPD EEPROM
    disk = root / "sys/block/sda/device"
    disk.mkdir(parents=True)
    (disk / "model").write_text("SAMSUNG MZ7LH960\n")
    (disk / "rev").write_text("3B6Q\n")
    (disk / "vpd_pg80").write_bytes(b"\x00\x80\x00\x0eS455NY0M123456")
    return root


def test_fingerprint_class_ignores_serials_the_node_does_not(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    xml = (REAL / "commands/nvidia-smi_-q_-x.xml").read_text()
    (tmp_path / "a.xml").write_text(xml)
    (tmp_path / "b.xml").write_text(
        xml.replace("<serial>1650000000001</serial>", "<serial>1650000000002</serial>")
    )
    root = root_with_hca_and_sata_disk(tmp_path)
    results = []
    for name in ("a", "b"):
        fake_tools(bindir, log, {"nvidia-smi": f"cat {tmp_path / name}.xml"})
        results.append(run_module(tmp_path, "fingerprint", {"root": str(root)}, bindir))
    a, b = (result["stethoscope_fingerprint"] for result in results)
    assert a["class_fingerprint"] == b["class_fingerprint"] and a["node_fingerprint"] != b["node_fingerprint"]
    assert a["detail"]["gpu"] == {
        "models": ["NVIDIA H200"],
        "count": 1,
        "driver": "580.159.04",
        "vbios": ["96.00.A5.00.1A"],
    }
    # a NIC or SSD swap is seen: their identities are in what the node fingerprint hashes
    assert a["detail"]["serials"]["nic"] == [
        {"node_guid": "a088:c203:00e3:142a", "sys_image_guid": None, "port_guids": []}
    ]
    assert a["detail"]["serials"]["disk"] == ["S455NY0M123456"]
    assert a["detail"]["disks"] == [{"vendor": None, "model": "SAMSUNG MZ7LH960", "firmware": "3B6Q"}]
    # VPD that is not VPD is a warning, never a failure of the task
    assert not results[0]["failed"]
    assert [w for w in a["warnings"] if w.startswith("mlx5_0: pci vpd: unknown resource tag 0xff")]


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio (Debian package) is installed by .ci/run")
def test_storage_sustained_write_reads_fios_own_latency_log(tmp_path):
    system = real_fio(tmp_path)
    result = run_module(
        tmp_path,
        "bench_storage",
        {
            "filename": str(tmp_path / "scratch.fio"),
            "mode": "sustained",
            "size": "16M",
            "runtime": 3,
            "log_dir": str(tmp_path),
            "state_dir": str(tmp_path / "s"),
        },
        system,
    )
    assert not result["failed"], result.get("msg")
    sustained = result["sustained"]
    assert sustained["points"] >= 2 and sustained["log"].endswith("stethoscope_sustained_clat.1.log")
    assert sustained["jump"] is None  # a 3 s write on a file does not fall off a cliff
    # no cliff within the run is still a value: the run's length, and the flag that says none
    labels = {"mode": "sustained", "bs": "4k", "iodepth": "64", "runtime": "3"}
    assert sorted((r["name"], r["value"], r["labels"] == labels) for r in result["stethoscope_metrics"]) == [
        ("bench_fio_latency_jump_seconds", 3.0, True),
        ("bench_fio_latency_jumped", 0.0, True),
    ]
    assert {r["metric_name"] for r in result["stethoscope_bench"]["results"]} == {
        "bench_fio_latency_jump_seconds",
        "bench_fio_latency_jumped",
    }
