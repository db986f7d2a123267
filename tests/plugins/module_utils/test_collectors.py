"""Collector logic across sweeps (cursors, rates, state files), with recorded output at the process
boundary: a runner that answers each argv from the real captures."""

from __future__ import annotations

import json
from pathlib import Path

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_gpu, collect_nvlink
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context

from conftest import REAL, fixture_text

XML = fixture_text("real/h200-vm/commands/nvidia-smi_-q_-x.xml")
DMON = fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt")
H200_LOG = fixture_text("real/h200-vm/commands/dmesg_nvrm_lines.txt")
# The real Xid line from gcm's sample, at the H200's bus address and with a boot-relative stamp.
XID_79 = "[ 5012.114211] NVRM: Xid (PCI:0000:00:06): 79, pid=0, GPU has fallen off the bus."


class Node:
    """A node root with a boot id, and tools answering from a dict of argv -> (rc, stdout)."""

    def __init__(self, tmp_path: Path, outputs: dict[tuple[str, ...], tuple[int, str]]):
        self.root = tmp_path / "root"
        self.state = tmp_path / "state"
        self.outputs = outputs
        self.calls: list[tuple[str, ...]] = []
        self.clock = 1000.0
        self.boot("boot-1")

    def boot(self, boot_id: str) -> None:
        path = self.root / "proc/sys/kernel/random/boot_id"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(boot_id + "\n")

    def context(self, check_mode: bool = False) -> Context:
        def runner(argv, _timeout, _env=None):
            self.calls.append(tuple(argv))
            return (*self.outputs.get(tuple(argv), (127, "")), "")

        return Context(
            runner,
            lambda name: f"/usr/bin/{name}",
            root=str(self.root),
            state_dir=str(self.state),
            check_mode=check_mode,
            clock=lambda: self.clock,
        )


def xid_counts(result) -> dict[str, float]:
    return {
        row["labels"]["xid"]: row["value"]
        for row in result["metrics"]
        if row["name"] == "gpu_xid_errors_total"
    }


def h200(tmp_path: Path, log: str) -> Node:
    return Node(
        tmp_path,
        {
            ("nvidia-smi", "-q", "-x"): (0, XML),
            ("nvidia-smi", "dmon", "-c", "1", "-s", "pucvmet"): (0, DMON),
            ("dmesg",): (0, log),
        },
    )


def preexisting(result) -> dict[tuple[str, str], float]:
    return {
        (row["device"], row["labels"]["xid"]): row["value"]
        for row in result["metrics"]
        if row["name"] == "gpu_xid_preexisting_total"
    }


def test_xid_cursor_counts_each_event_once_and_survives_a_reboot(tmp_path):
    node = h200(tmp_path, H200_LOG)
    assert xid_counts(collect_gpu.collect(node.context())) == {}  # the first read: nothing there
    node.outputs[("dmesg",)] = (0, H200_LOG + XID_79 + "\n")
    first = collect_gpu.collect(node.context())
    assert xid_counts(first) == {"79": 1} and first["facts"]["xid"]["events"][0]["device"] == "gpu0"
    again = collect_gpu.collect(node.context())  # same boot, same log: nothing new
    assert xid_counts(again) == {"79": 1} and again["facts"]["xid"]["events"] == []
    node.boot("boot-2")  # after a reboot the log restarts with smaller stamps; the count carries on
    node.outputs[("dmesg",)] = (0, H200_LOG + XID_79.replace("5012.114211", "  12.000001") + "\n")
    rebooted = collect_gpu.collect(node.context())
    assert xid_counts(rebooted) == {"79": 2} and preexisting(rebooted) == {}


def test_first_read_marks_the_xids_already_in_the_log_as_preexisting(tmp_path):
    node = h200(tmp_path, H200_LOG + XID_79 + "\n" + XID_79.replace("5012.114211", "5013.000000") + "\n")
    first = collect_gpu.collect(node.context())
    assert xid_counts(first) == {"79": 0} and first["facts"]["xid"]["events"] == []
    assert preexisting(first) == {("gpu0", "79"): 2}
    assert first["facts"]["xid_preexisting"] == {"gpu0": {"79": 2}}
    node.outputs[("dmesg",)] = (
        0,
        node.outputs[("dmesg",)][1] + XID_79.replace("5012.114211", "6000.000000") + "\n",
    )
    later = collect_gpu.collect(node.context())  # one new event, counted from the 0 of the first read
    assert xid_counts(later) == {"79": 1} and preexisting(later) == {}
    assert later["facts"]["xid_preexisting"] == {}


def test_check_mode_reads_but_does_not_move_the_cursor(tmp_path):
    node = h200(tmp_path, H200_LOG + XID_79 + "\n")
    checked = collect_gpu.collect(node.context(check_mode=True))
    assert xid_counts(checked) == {"79": 0} and preexisting(checked) == {("gpu0", "79"): 1}
    assert not node.state.exists()
    first = collect_gpu.collect(node.context())  # still the first read: check mode set no cursor
    assert xid_counts(first) == {"79": 0} and preexisting(first) == {("gpu0", "79"): 1}
    assert preexisting(collect_gpu.collect(node.context())) == {}


def test_unreadable_kernel_log_falls_back_to_the_journal(tmp_path):
    node = h200(tmp_path, "")
    node.outputs[("dmesg",)] = (1, "dmesg: read kernel buffer failed: Operation not permitted")
    node.outputs[("journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic")] = (
        0,
        XID_79.replace("] NVRM", "] gpu-node kernel: NVRM") + "\n",
    )
    result = collect_gpu.collect(node.context())
    assert result["facts"]["xid"]["source"] == "journalctl"
    assert xid_counts(result) == {"79": 0} and preexisting(result) == {("gpu0", "79"): 1}


def test_nvlink_error_rate_comes_from_deltas_never_from_totals(tmp_path):
    status = fixture_text("public/nvidia-smi/nvlink_status_8xA100_gpud.txt")

    def counters(crc: int, kib: int) -> dict:
        errors = "GPU 0: A100 (UUID: GPU-0)\n\t Link 0: Replay Errors: 0\n\t Link 0: CRC Errors: %d\n" % crc
        data = "GPU 0: A100 (UUID: GPU-0)\n\t Link 0: Data Tx: %d KiB\n\t Link 0: Data Rx: 0 KiB\n" % kib
        return {
            ("nvidia-smi", "nvlink", "-s"): (0, status),
            ("nvidia-smi", "nvlink", "-e"): (0, errors),
            ("nvidia-smi", "nvlink", "-gt", "d"): (0, data),
        }

    node = Node(tmp_path, counters(crc=500, kib=1_000_000))
    first = collect_nvlink.collect(node.context())
    assert not [r for r in first["metrics"] if r["name"] == "nvlink_error_rate_percent"]  # no previous sweep
    node.outputs = counters(crc=510, kib=2_000_000)
    second = collect_nvlink.collect(node.context())
    (rate,) = [r for r in second["metrics"] if r["name"] == "nvlink_error_rate_percent"]
    assert rate["device"] == "gpu0/link0" and rate["value"] == 10 / 1_000_000 * 100
    up = {r["device"]: r["value"] for r in second["metrics"] if r["name"] == "nvlink_link_up"}
    assert len(up) == 96 and set(up.values()) == {1}
    saved = json.loads((node.state / "nvlink.json").read_text())
    assert saved["links"]["gpu0/link0"] == {"errors": 510, "data_kib": 2_000_000}


def test_real_h200_root_has_no_nvlink_and_no_aer(tmp_path):
    node = Node(tmp_path, {("nvidia-smi", "nvlink", "-s"): (0, "")})
    assert collect_nvlink.collect(node.context())["present"] is False
    assert (REAL / "root/sys/bus/pci/devices/0000:00:06.0/current_link_width").read_text().strip() == "16"
