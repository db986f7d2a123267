"""Modules run by Ansible itself (ad-hoc, local connection) with recorded real tool output placed at
the process boundary: fake tools on PATH that log their argv and print a capture."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import REAL, fake_tools, run_module


@pytest.fixture
def h200(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(
        bindir,
        log,
        {
            "nvidia-smi": {
                "-q -x": "real/h200-vm/commands/nvidia-smi_-q_-x.xml",
                "dmon -c 1 -s pucvmet": "real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt",
                "nvlink -s": "real/h200-vm/commands/nvidia-smi_nvlink_--status.txt",
            },
            "dmesg": "real/h200-vm/commands/dmesg_nvrm_lines.txt",
        },
    )
    return bindir, log


def test_gpu_facts_argv_and_check_mode(tmp_path, h200):
    bindir, log = h200
    state = tmp_path / "state"
    args = {"root": str(REAL / "root"), "state_dir": str(state)}
    checked = run_module(tmp_path, "gpu_facts", args, bindir, check=True)
    assert checked["changed"] is False and not checked.get("failed")
    assert log.read_text().splitlines() == ["nvidia-smi -q -x", "nvidia-smi dmon -c 1 -s pucvmet", "dmesg"]
    assert not state.exists()  # check mode writes no state file
    result = run_module(tmp_path, "gpu_facts", args, bindir)
    assert result["changed"] is False
    assert (state / "gpu_xid.json").is_file()
    facts = result["ansible_facts"]["stethoscope_gpu"]
    assert facts["present"] is True and facts["gpus"][0]["name"] == "NVIDIA H200"
    names = {row["name"] for row in result["stethoscope_metrics"]}
    assert {"gpu_temperature_celsius", "gpu_pcie_tx_mb_per_s", "gpu_throttle_reasons_active"} <= names


def test_h200_without_nvlink_is_not_present(tmp_path, h200):
    bindir, log = h200
    result = run_module(tmp_path, "nvlink_facts", {"state_dir": str(tmp_path / "s")}, bindir)
    assert result["ansible_facts"]["stethoscope_nvlink"]["present"] is False
    assert result["stethoscope_metrics"] == [] and log.read_text().splitlines() == ["nvidia-smi nvlink -s"]


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a real nvidia-smi")
def test_missing_tool_is_not_present(tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    result = run_module(tmp_path, "gpu_facts", {"state_dir": str(tmp_path / "s")}, empty)
    assert result["ansible_facts"]["stethoscope_gpu"] == {"present": False, "reason": "nvidia-smi not found"}
    assert result["stethoscope_metrics"] == [] and result["failed"] is False


def test_garbage_output_fails_naming_tool_and_line(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    root = tmp_path / "root"
    (root / "sys/block/sda").mkdir(parents=True)
    fake_tools(bindir, log, {"smartctl": "echo 'smartctl 7.3 2022-02-28 r5338'; echo 'not json at all'"})
    result = run_module(
        tmp_path, "smart_facts", {"root": str(root), "state_dir": str(tmp_path / "s")}, bindir
    )
    assert result["failed"] is True
    assert result["msg"].startswith("smartctl -j: not JSON") and "at line 1" in result["msg"]
    assert "module_stderr" not in result and "Traceback" not in json.dumps(result)
    # the scan for disks behind a RAID controller runs first; its garbage is a warning, the disk is read
    assert log.read_text().splitlines() == ["smartctl --scan", "smartctl -j -a /dev/sda"]


def test_hung_tool_is_killed_by_the_timeout(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(bindir, log, {"nvidia-smi": "sleep 30"})
    result = run_module(tmp_path, "gpu_facts", {"timeout": 1, "state_dir": str(tmp_path / "s")}, bindir)
    assert result["failed"] is True and "timed out after 1s" in result["msg"]


def test_tuning_reads_the_volatile_write_cache_feature_0x06(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    root = tmp_path / "root"
    shutil.copytree(REAL / "root", root)
    (root / "sys/class/nvme/nvme0").mkdir(parents=True)
    fake_tools(
        bindir, log, {"nvme": "echo 'get-feature:0x06 (Volatile Write Cache), Current value:0x00000001'"}
    )
    result = run_module(
        tmp_path, "tuning_facts", {"root": str(root), "state_dir": str(tmp_path / "s")}, bindir, check=True
    )
    assert log.read_text().splitlines() == ["nvme get-feature /dev/nvme0 --feature-id=0x06"]
    tuning = result["ansible_facts"]["stethoscope_tuning"]
    assert tuning["nvme_volatile_write_cache"] == {"nvme0": {"enabled": 1}}
    assert tuning["cpufreq"] is False and "no cpufreq" in tuning["cpufreq_reason"]  # the H200 VM has none
    assert tuning["numa_balancing"] == 0


def test_health_facts_reports_the_failed_collector_and_keeps_the_others(tmp_path, h200):
    bindir, log = h200
    fake_tools(bindir, log, {"smartctl": "echo garbage"})
    root = tmp_path / "root"
    shutil.copytree(REAL / "root", root)
    (root / "sys/block/nvme0n1").mkdir(parents=True)
    result = run_module(
        tmp_path, "health_facts", {"root": str(root), "state_dir": str(tmp_path / "s")}, bindir
    )
    assert result["failed"] is True and result["failed_collectors"] == ["smart"]
    assert "stethoscope_gpu" in result["ansible_facts"] and "stethoscope_tuning" in result["ansible_facts"]
    assert any(row["name"] == "gpu_temperature_celsius" for row in result["stethoscope_metrics"])
