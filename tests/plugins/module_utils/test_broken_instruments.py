"""Broken instruments are findings: a collector's tool that fails is stored as rows naming the tool,
its exit code and cause, and a failure that means hardware (a GPU nvidia-smi cannot reach, an HCA
gone, a disk smartctl cannot open) is a critical finding of its layer. The tool's words come from
real public captures (tests/fixtures/public/SOURCES.md); the end-to-end case runs the real gpu_facts
module in ansible-playbook with nvidia-smi replayed at the process boundary, the ClickHouse callback
into embedded ClickHouse and the shipped rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_xid_first_event import NODE, at_boot_time, findings
from test_xid_first_event import sweep as first_event_sweep

from ansible_collections.aicluster.stethoscope.plugins.module_utils import (
    collect_gpu,
    collect_rdma,
    collector_failure,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    Context,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    FAILURE_STATE,
    run_collectors,
)
from stethoscope.store.client import Store

from conftest import PUBLIC, fixture_text

XML = fixture_text("real/h200-vm/commands/nvidia-smi_-q_-x.xml")
DMON = fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt")
H200_LOG = fixture_text("real/h200-vm/commands/dmesg_nvrm_lines.txt")
H200_BUS = "00000000:00:06.0"  # the H200 capture's only GPU, gpu0
NVIDIA_SMI = "public/nvidia-smi/"
# gpud's README capture of an HGX node: the Xid 79 line (a markdown quote: "> " before the kernel's text)
XID_79 = next(
    line[2:]
    for line in (PUBLIC / "dmesg/xid79_nvrm_fallen_off_bus_sxid20034_hgx_gpud_readme.txt")
    .read_text()
    .splitlines()
    if ": 79, " in line
)


SMI_LOST = NVIDIA_SMI + "a_device_handle_gpu_is_lost_k8s-device-plugin-231.txt"
SMI_UNKNOWN = NVIDIA_SMI + "a_i0_device_handle_unknown_error_nvidia-docker-1553.txt"
SMI_NO_DEVICES = NVIDIA_SMI + "no_devices_were_found_rtx5090_open-gpu-kernel-modules-862.txt"
IBSTAT_PANIC = "public/infiniband/ibstat_a100_azure_cx6vf_ibpanic_exit255.txt"


@pytest.mark.parametrize(
    ("capture", "tool", "rc", "had_hardware", "cause"),
    [
        (SMI_UNKNOWN, "nvidia-smi", 255, True, "gpu_lost"),  # nvidia-smi -a -i 0 on a failed GPU
        (SMI_LOST, "nvidia-smi", 15, False, "gpu_lost"),  # nvidia-smi -a after a GPU crashed
        # "No devices were found" means a lost GPU only on a node that had GPUs
        (SMI_NO_DEVICES, "nvidia-smi", 6, True, "gpu_lost"),
        (SMI_NO_DEVICES, "nvidia-smi", 6, False, "tool_failed"),
        (IBSTAT_PANIC, "ibstat", 255, False, "hca_missing"),  # an IB device it listed cannot be read
    ],
)
def test_a_failure_is_classified_from_the_tools_real_words(capture, tool, rc, had_hardware, cause):
    assert collector_failure.classify(tool, rc, fixture_text(capture), had_hardware) == cause


def test_other_failures_are_the_instrument_itself():
    assert collector_failure.classify(
        "smartctl", 2, "Smartctl open device: /dev/sda failed: Permission denied", True
    ) == ("tool_failed")
    assert collector_failure.classify("nvidia-smi", 124, "", True) == "tool_failed"  # hung: timed out
    assert collector_failure.classify("ibv_devinfo", 0, "", False) == "tool_failed"  # no HCA ever seen
    # 255 is NVML's catch-all (also a container that lost its device cgroup): the GPU only by its words
    nvml = "Failed to initialize NVML: Unknown Error"
    assert collector_failure.classify("nvidia-smi", 255, nvml, True) == "tool_failed"
    # 15: "GPU has fallen off the bus or has otherwise become inaccessible" (nvidia-smi(1))
    assert collector_failure.classify("nvidia-smi", 15, "", True) == "gpu_lost"


class Node:
    """A node root with a boot id, and tools answering argv -> (rc, stdout, stderr)."""

    def __init__(self, tmp_path: Path):
        self.root, self.state = tmp_path / "root", tmp_path / "state"
        (self.root / "proc/sys/kernel/random").mkdir(parents=True)
        (self.root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
        self.outputs: dict[tuple[str, ...], tuple[int, str, str]] = {}

    def context(self) -> Context:
        def runner(argv, _timeout, _env=None):
            return self.outputs.get(tuple(argv), (127, "", "%s: command not found" % argv[0]))

        return Context(
            runner, lambda name: f"/usr/bin/{name}", root=str(self.root), state_dir=str(self.state)
        )


def lost_gpu_words() -> str:
    """The real "GPU is lost" failure, naming the H200's bus (as tools/lab.py derives faults)."""
    real = fixture_text(SMI_LOST)
    return real.replace("0000:C1:00.0", H200_BUS)


def test_nvidia_smi_failing_still_reads_the_kernel_log_and_names_the_lost_gpu(tmp_path):
    node = Node(tmp_path)
    node.outputs = {
        ("nvidia-smi", "-q", "-x"): (0, XML, ""),
        ("nvidia-smi", "dmon", "-c", "1", "-s", "pucvmet"): (0, DMON, ""),
        ("dmesg",): (0, H200_LOG, ""),
    }
    healthy = collect_gpu.collect(node.context())
    assert healthy["present"] is True and not healthy.get("failures")
    node.outputs[("nvidia-smi", "-q", "-x")] = (255, "", lost_gpu_words())
    node.outputs[("dmesg",)] = (0, H200_LOG + at_boot_time(XID_79, 6000.5), "")
    lost = collect_gpu.collect(node.context())
    (failure,) = lost["failures"]
    assert (failure["tool"], failure["rc"], failure["cause"], failure["device"]) == (
        "nvidia-smi",
        255,
        "gpu_lost",
        "gpu0",
    )
    assert failure["first_line"].startswith("Unable to determine the device handle for GPU 00000000:00:06.0")
    xid = {
        (r["device"], r["labels"]["xid"]): r["value"]
        for r in lost["metrics"]
        if r["name"] == "gpu_xid_errors_total"
    }
    assert xid == {("gpu0", "79"): 1.0}


def test_a_lost_gpu_nvidia_smi_cannot_name_is_named_by_the_kernel_logs_xid_79(tmp_path):
    """ "No devices were found" names no bus; the same sweep's Xid 79 does: the failure is that GPU's,
    so its finding joins the Xid 79's incident (one ticket, one drain), not one of the collector's;
    the next sweeps name it so too, though the log has nothing new."""
    node = Node(tmp_path)
    node.outputs = {
        ("nvidia-smi", "-q", "-x"): (0, XML, ""),
        ("nvidia-smi", "dmon", "-c", "1", "-s", "pucvmet"): (0, DMON, ""),
        ("dmesg",): (0, H200_LOG, ""),
    }
    collect_gpu.collect(node.context())
    node.outputs[("nvidia-smi", "-q", "-x")] = (6, fixture_text(SMI_NO_DEVICES), "")
    node.outputs[("dmesg",)] = (0, H200_LOG + at_boot_time(XID_79, 6000.5), "")
    (failure,) = collect_gpu.collect(node.context())["failures"]
    assert (failure["cause"], failure["device"]) == ("gpu_lost", "gpu0")
    node.outputs[("dmesg",)] = (0, H200_LOG + at_boot_time(XID_79, 6000.5), "")  # nothing new in the log
    (again,) = collect_gpu.collect(node.context())["failures"]
    assert (again["cause"], again["device"]) == ("gpu_lost", "gpu0")  # still that GPU's, as it was


def test_a_dead_hca_named_by_ibstat_is_hca_missing(tmp_path):
    node = Node(tmp_path)
    ibpanic = fixture_text(IBSTAT_PANIC)
    node.outputs = {("ibstat",): (255, ibpanic, "")}
    with pytest.raises(collect_rdma.CollectorError) as caught:
        collect_rdma.collect(node.context())
    failure = collector_failure.from_error("rdma", caught.value)
    assert (failure["tool"], failure["rc"], failure["cause"]) == ("ibstat", 255, "hca_missing")
    rows = {row["name"]: row for row in collector_failure.failure_rows(failure)}
    assert rows["collector_hca_missing"]["value"] == 1.0
    assert rows["collector_failed"]["labels"] == {
        "collector": "rdma",
        "tool": "ibstat",
        "rc": "255",
        "cause": "hca_missing",
    }


def test_an_hca_gone_since_an_earlier_sweep_is_said_while_the_others_are_still_read(tmp_path):
    """One HCA of the real H100 ConnectX-7 tree disappears: hca_missing for it, every sweep until it
    is back, and the other HCAs' rows are kept (a dead HCA never hides the healthy ones)."""
    import shutil

    node = Node(tmp_path)
    tree = node.root / "sys/class/infiniband"
    shutil.copytree(PUBLIC / "sysfs/sys-class-infiniband-h100_gpud", tree, symlinks=True)
    context = Context(
        lambda argv, _timeout, _env=None: (127, "", "not here"),
        lambda name: None,  # no ibv_devinfo, no rdma tool: sysfs alone
        root=str(node.root),
        state_dir=str(node.state),
    )
    healthy = collect_rdma.collect(context)
    assert not healthy.get("failures") and "mlx5_1/1" in healthy["facts"]["ports"]
    shutil.rmtree(tree / "mlx5_1")
    for _sweep in range(2):
        later = collect_rdma.collect(context)
        (failure,) = later["failures"]
        assert (failure["cause"], failure["device"]) == ("hca_missing", "mlx5_1")
        states = {r["device"] for r in later["metrics"] if r["name"] == "ib_port_state"}
        assert "mlx5_0/1" in states and "mlx5_1/1" not in states


def sweep(tmp_path: Path, dsn: str, kernel_log: str, nvidia_smi_fails: bool) -> subprocess.CompletedProcess:
    """One real ansible-playbook run of gpu_facts with the ClickHouse callback (test_xid_first_event's),
    nvidia-smi failing as a lost GPU makes it fail when asked."""
    lost = tmp_path / "lost.txt"
    lost.write_text(lost_gpu_words())
    if not nvidia_smi_fails:
        return first_event_sweep(tmp_path, dsn, kernel_log)
    return first_event_sweep(tmp_path, dsn, kernel_log, f'cat "{lost}" >&2; exit 255', check=False)


def stored(dsn: str, metric: str) -> list[tuple[str, dict, float]]:
    with Store(dsn) as store:
        rows = store.query(
            "SELECT device, labels, value FROM stethoscope.metrics FINAL WHERE metric_name = {m:String} "
            "ORDER BY timestamp",
            {"m": metric},
        )
    return [(device, dict(labels), value) for device, labels, value in rows]


def test_a_gpu_lost_mid_run_is_a_critical_finding_on_the_sweep_that_first_sees_it(tmp_path, tmp_dsn):
    healthy = sweep(tmp_path, tmp_dsn, H200_LOG, nvidia_smi_fails=False)
    assert healthy.returncode == 0, healthy.stdout[-3000:]
    assert [f for f in findings(tmp_dsn) if f[3] == "critical"] == []
    lost = sweep(tmp_path, tmp_dsn, H200_LOG + at_boot_time(XID_79, 6000.5), nvidia_smi_fails=True)
    assert lost.returncode != 0 and "GPU is lost" in lost.stdout  # the task fails, loudly, with its rows
    labels = {"collector": "gpu", "tool": "nvidia-smi", "rc": "255", "cause": "gpu_lost"}
    assert stored(tmp_dsn, "collector_failed") == [("gpu0", labels, 1.0)]
    critical = {f[:3] for f in findings(tmp_dsn) if f[3] == "critical"}
    assert {("collector_gpu_lost", NODE, "gpu0"), ("gpu_xid_79", NODE, "gpu0")} <= critical
    with Store(tmp_dsn) as store:
        (facts,) = store.query(
            "SELECT facts FROM stethoscope.facts WHERE collector = 'gpu' ORDER BY collected_at DESC LIMIT 1"
        )[0]
    assert "Unable to determine the device handle for GPU 00000000:00:06.0: GPU is lost" in facts
    back = sweep(tmp_path, tmp_dsn, H200_LOG + at_boot_time(XID_79, 6000.5), nvidia_smi_fails=False)
    assert back.returncode == 0, back.stdout[-3000:]
    assert [value for _d, _l, value in stored(tmp_dsn, "collector_gpu_lost")] == [1.0, 0.0]  # it clears


class ModuleStandIn:
    """What run_collectors asks of AnsibleModule: its parameters, and the result it ends with."""

    def __init__(self, state_dir: Path):
        self.params = {"root": "/", "state_dir": str(state_dir), "timeout": 5}
        self.check_mode = False
        self.result: dict = {}

    def get_bin_path(self, _name):
        return None

    def warn(self, _text):
        pass

    def fail_json(self, **result):
        self.result = dict(result, failed=True)

    def exit_json(self, **result):
        self.result = result


def test_a_cleared_failure_is_sent_at_0_for_a_day_then_forgotten(tmp_path):
    """A repaired instrument's failure series is sent at 0 while UNKNOWN would miss it (24 h), then
    dropped: the node's memory of failures does not grow with every exit code it ever saw."""

    def failing(_ctx, _done):
        raise CollectorError("cpupower failed", cmd=["cpupower", "frequency-info"], rc=1, stderr="no")

    def answering(_ctx, _done):
        return {"present": True, "facts": {}, "metrics": [], "warnings": []}

    def sweep(collect) -> dict:
        module = ModuleStandIn(tmp_path)
        run_collectors(module, [("tuning", collect)])
        return {(r["name"], r["device"]): r["value"] for r in module.result["stethoscope_metrics"]}

    state = tmp_path / f"{FAILURE_STATE}.json"
    assert sweep(failing)[("collector_failed", "tuning")] == 1
    assert sweep(answering)[("collector_failed", "tuning")] == 0
    assert sweep(answering)[("collector_failed", "tuning")] == 0
    kept = json.loads(state.read_text())
    for row in kept["tuning"]:
        row["cleared_at"] -= 25 * 3600  # as if it was cleared a day and an hour ago
    state.write_text(json.dumps(kept))
    assert sweep(answering) == {}
    assert json.loads(state.read_text()) == {}
