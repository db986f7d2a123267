"""The lab: built from the real captures, faults derived by the script, counters growing per step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FIXTURES, TOP


def lab_cmd(lab_dir: Path, *args: str) -> str:
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(lab_dir)}
    return subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab_dir = tmp_path_factory.mktemp("lab")
    lab_cmd(lab_dir, "build", "--nodes", "8")
    return lab_dir


def replay(lab_dir: Path, node: str, tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(lab_dir / "nodes" / node / "bin" / tool), *args], capture_output=True, text=True, check=False
    )


def test_healthy_node_replays_the_unedited_real_capture(lab):
    out = replay(lab, "node01", "nvidia-smi", "-q", "-x")
    assert out.returncode == 0
    assert out.stdout == (FIXTURES / "real/h200-vm/commands/nvidia-smi_-q_-x.xml").read_text()


def test_unknown_arguments_are_refused(lab):
    out = replay(lab, "node01", "nvidia-smi", "--reset-gpu")
    assert out.returncode == 2 and "no recording" in out.stderr


def test_faults_change_only_what_they_name(lab):
    real = (FIXTURES / "real/h200-vm/commands/nvidia-smi_-q_-x.xml").read_text().splitlines()
    faulted = replay(lab, "node03", "nvidia-smi", "-q", "-x").stdout.splitlines()
    changed = {a.strip().split(">")[0] for a, b in zip(real, faulted, strict=True) if a != b}
    assert changed == {
        "<gpu_temp",
        "<clocks_event_reason_hw_thermal_slowdown",
        "<clocks_event_reason_sw_thermal_slowdown",
        "<clocks_event_reason_gpu_idle",
        "<sm_clock",
    }


def test_counters_grow_each_step(tmp_path):
    lab_cmd(tmp_path, "build", "--nodes", "8")
    symbol = tmp_path / "nodes/node08/root/sys/class/infiniband/mlx5_1/ports/1/counters/symbol_error"
    ssd = lambda: json.loads(replay(tmp_path, "node07", "smartctl", "-j", "-a", "/dev/sda").stdout)  # noqa: E731
    realloc = lambda: next(a["raw"]["value"] for a in ssd()["ata_smart_attributes"]["table"] if a["id"] == 5)  # noqa: E731
    before = (int(symbol.read_text()), realloc())
    assert lab_cmd(tmp_path, "advance").strip() == "lab: step 1"
    after = (int(symbol.read_text()), realloc())
    assert after[0] > before[0] and after[1] > before[1] == 4  # 4 is the real Intel S4500 value


def test_scaled_lab_and_its_inventory(tmp_path):
    inventory = tmp_path / "inv" / "hosts.yml"
    lab_cmd(tmp_path / "lab", "build", "--nodes", "20", "--inventory", str(inventory))
    assert len(list((tmp_path / "lab/nodes").iterdir())) == 20
    assert "node20: {slurm_name: node20}" in inventory.read_text()
    assert (inventory.parent / "group_vars/all.yml").is_file()


def test_climbing_ssd_is_the_worn_ssds_slow_variant_derived_from_the_real_capture(tmp_path):
    lab_cmd(tmp_path, "build", "--nodes", "7", "--only-faults", "climbing_ssd")
    real = json.loads((FIXTURES / "public/smartctl/sata_ssd_intel_s4500_realloc4_wear55.json").read_text())

    def attributes():
        out = replay(tmp_path, "node07", "smartctl", "-j", "-a", "/dev/sda").stdout
        table = json.loads(out)["ata_smart_attributes"]["table"]
        return {a["name"]: (a["raw"]["value"], a["value"]) for a in table}

    start = attributes()
    assert start == {
        a["name"]: (a["raw"]["value"], a["value"]) for a in real["ata_smart_attributes"]["table"]
    }
    lab_cmd(tmp_path, "advance")
    lab_cmd(tmp_path, "advance")
    after = attributes()
    changed = {name for name in start if start[name] != after[name]}
    assert changed == {"Reallocated_Sector_Ct", "Media_Wearout_Indicator"}
    assert after["Reallocated_Sector_Ct"][0] == 4 + 2 * 2 and after["Media_Wearout_Indicator"][1] == 55 - 2


def test_a_climbing_ssd_is_warned_about_before_it_crosses_its_hard_limit(tmp_path, store):
    """The reviewer's slow fault: sectors climbing for an hour were reported only past 100."""
    from lab_replay import SWEEP_MS, first_findings

    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.rules import load_rules
    from stethoscope.timeutil import now_ms

    rules = [r for r in load_rules(TOP / "rules", Catalog.load()).rules if r.family == "ssd_reallocated"]
    lab_cmd(tmp_path, "build", "--nodes", "7", "--only-faults", "climbing_ssd")
    steps = 52
    first = first_findings(store, tmp_path, "node07", ["sda"], rules, steps, now_ms() - steps * SWEEP_MS)
    assert first["ssd_reallocated_sectors"] == 49  # 4 + 2 x 49 = 102 > 100, wear-out 8 < 10
    assert first["ssd_reallocated_climbing"] < first["ssd_reallocated_sectors"]


def test_an_injected_xid_79_starts_now_on_the_nodes_gpu_0_and_stays(tmp_path):
    from ansible_collections.aicluster.stethoscope.plugins.module_utils.kernel_log import parse_xid_events

    lab_cmd(tmp_path, "build", "--nodes", "8")
    dmesg = lambda node: replay(tmp_path, node, "dmesg").stdout  # noqa: E731
    assert [e["xid"] for e in parse_xid_events(dmesg("node05"))] == []
    assert lab_cmd(tmp_path, "inject", "node05", "xid_79").strip() == "lab: xid_79 on node05"
    gpus = replay(tmp_path, "node05", "nvidia-smi", "-q", "-x").stdout
    first_bus = gpus.split("<pci_bus_id>", 1)[1][4:14].lower()  # 00000000:BB:DD.F -> 0000:bb:dd
    for _ in range(2):  # at once, and after each later step
        events = parse_xid_events(dmesg("node05"))
        assert [(e["xid"], e["bdf"]) for e in events] == [(79, first_bus)]
        assert "GPU has fallen off the bus" in events[0]["line"]
        lab_cmd(tmp_path, "advance")
    assert parse_xid_events(dmesg("node01")) == []  # only the node named


def test_inject_refuses_a_node_the_lab_has_not(tmp_path):
    lab_cmd(tmp_path, "build", "--nodes", "2")
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "inject", "node07", "xid_79"],
        env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 1 and "no node node07" in out.stderr
