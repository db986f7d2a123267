"""The node agent as a node runs it: copied files, the node's python, no controller dependencies; reads
that fail leave their slot missing (never zero) and never stop it; counters travel as rates."""

from __future__ import annotations

import ast
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from stethoscope.telemetry import agent as agent_module
from stethoscope.telemetry import wire
from stethoscope.telemetry.agent import READERS, Agent
from stethoscope.telemetry.metric_set import load_sets

TOP = Path(__file__).resolve().parents[2]
ROLE_FILES = TOP / "roles/push_agent/files"
KEY = bytes(range(32))


def copied_by_the_role() -> list[str]:
    """The files the push_agent role copies to a node (its loop over roles/push_agent/files)."""
    blocks = yaml.safe_load((TOP / "roles/push_agent/tasks/main.yml").read_text())
    tasks = [task for block in blocks for task in block.get("block", [])]
    (copied,) = [task["loop"] for task in tasks if "agent.py" in (task.get("loop") or [])]
    return copied


NODE_SIDE = copied_by_the_role()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("lab")
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(directory)}
    subprocess.run([sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "2"], env=env, check=True)
    return directory


def _config(root: Path, port: int = 9, **extra) -> dict:
    config = {
        "collector": f"127.0.0.1:{port}",
        "node_id": "node02",
        "node_key": 2,
        "key": KEY.hex(),
        "set": load_sets()["gpu_node"].render(),
        "root": str(root),
        "gpu_source": "none",
    }
    config.update(extra)
    return config


@pytest.mark.parametrize("name", NODE_SIDE)
def test_node_side_file_parses_as_python_3_8(name: str) -> None:
    ast.parse((ROLE_FILES / name).read_text(), filename=name, feature_version=(3, 8))


def test_agent_runs_from_copied_files_with_controller_dependencies_blocked(tmp_path: Path, lab: Path) -> None:
    node = tmp_path / "opt"
    node.mkdir()
    for name in NODE_SIDE:
        shutil.copy(ROLE_FILES / name, node / name)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    (tmp_path / "set.json").write_text(json.dumps(load_sets()["gpu_node"].render()))
    (tmp_path / "key").write_text(KEY.hex() + "\n")
    config = _config(lab / "nodes/node02/root", receiver.getsockname()[1], period=0.2)
    del config["set"], config["key"]
    config.update(set_file=str(tmp_path / "set.json"), key_file=str(tmp_path / "key"))
    (tmp_path / "agent.json").write_text(json.dumps(config))
    blocker = textwrap.dedent(f"""
        import importlib.abc, runpy, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("chdb", "clickhouse_connect", "yaml", "stethoscope", "pynvml"):
                    raise ImportError("blocked on a node: " + name)
        sys.meta_path.insert(0, Block())
        sys.path.insert(0, {str(node)!r})
        sys.argv = ["agent.py", "--config", {str(tmp_path / "agent.json")!r}, "--duration", "0.5"]
        runpy.run_path({str(node / "agent.py")!r}, run_name="__main__")
    """)
    run = subprocess.run(
        [sys.executable, "-c", blocker], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert run.returncode == 0, run.stderr
    assert "stopped: periods=" in run.stderr
    samples = []
    receiver.setblocking(False)
    while True:
        try:
            data = receiver.recv(2048)
        except BlockingIOError:
            break
        samples.append(wire.decode(data, lambda _k: [KEY], wire.parse_header(data).ts_ms))
    assert samples and all(isinstance(s, wire.Sample) for s in samples)
    assert {s.header.node_key for s in samples} == {2}


def test_unreadable_counter_leaves_its_slot_missing_and_the_agent_goes_on(tmp_path: Path, lab: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(lab / "nodes/node02/root", root, symlinks=True)
    agent = Agent(_config(root))
    slots = [slot["metric"] for slot in agent.metric_set["parts"]["node"]]
    state_slot = slots.index("ib_port_state")
    for state in root.glob("sys/class/infiniband/*/ports/*/state"):
        state.unlink()
        state.mkdir()  # reading a directory fails like a vanished sysfs file
    values = agent.sample(100.0)[wire.NODE_PART]
    assert math.isnan(values[state_slot])
    assert agent.counters.read_errors > 0
    errors = agent.counters.read_errors
    agent.tick(0, 105.0)  # and the next period goes on, sending
    assert agent.counters.read_errors > errors
    assert agent.counters.sent + agent.counters.send_errors == 1


def test_hardware_a_node_lacks_is_missing_not_zero(tmp_path: Path) -> None:
    agent = Agent(_config(tmp_path))  # an empty root: no IB, no AER, no NVMe, no GPU
    values = agent.sample(100.0)[wire.NODE_PART]
    assert all(math.isnan(v) for v in values)


def _nvme_drives(root: Path, celsius: dict[str, float]) -> None:
    """NVMe drives in a constructed sysfs tree (no capture: the kernel's layout), each drive's hwmon
    where one of two kernel generations puts it: under the controller (nvme0: the newer), under its PCI
    function (the first kernels with NVMe hwmon)."""
    for index, (controller, value) in enumerate(sorted(celsius.items())):
        parent = "" if index % 2 == 0 else "device/hwmon/"
        hwmon = root / f"sys/class/nvme/{controller}/{parent}hwmon{index + 1}"
        hwmon.mkdir(parents=True)
        (hwmon / "temp1_input").write_text(f"{int(value * 1000)}\n")
    (root / "sys/class/nvme/nvme0/nvme0n1").mkdir()  # a namespace: not a drive of its own


def test_nvme_drives_under_a_root_prefix_are_named_each_and_the_hottest_is_the_nodes(tmp_path: Path) -> None:
    """Regression: the drives were named by the 5th part of their path, right only under `/`: under a
    prefix two drives at 70 and 55 °C came out as one, and the node's maximum read 55."""
    root = tmp_path / "lab" / "nodes" / "node02" / "root"
    _nvme_drives(root, {"nvme0": 70.0, "nvme1": 55.0})
    sysfs = agent_module.SysfsSource(str(root), agent_module.Counters())
    sysfs.discover()
    assert sysfs.read()["nvme.temperature"] == {"nvme0": 70.0, "nvme1": 55.0}
    agent = Agent(_config(root))
    slots = [slot["metric"] for slot in agent.metric_set["parts"]["node"]]
    assert agent.sample(100.0)[wire.NODE_PART][slots.index("disk_temperature_celsius")] == 70.0


def test_counters_travel_as_rates_over_the_period(tmp_path: Path, lab: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(lab / "nodes/node02/root", root, symlinks=True)
    agent = Agent(_config(root))
    slots = [slot["metric"] for slot in agent.metric_set["parts"]["node"]]
    wait = slots.index("ib_port_xmit_wait_per_second")
    counters = sorted(root.glob("sys/class/infiniband/*/ports/*/counters/port_xmit_wait"))
    for path in counters:
        path.write_text("1000000\n")
    first = agent.sample(100.0)[wire.NODE_PART]
    assert math.isnan(first[wait])  # no previous reading: no rate yet
    counters[0].write_text("1002500\n")
    second = agent.sample(105.0)[wire.NODE_PART]
    assert second[wait] == pytest.approx(500.0)
    counters[0].write_text("10\n")  # a counter reset gives no rate, never a negative one
    assert agent.sample(110.0)[wire.NODE_PART][wait] == pytest.approx(0.0)


def test_each_period_sends_the_new_sample_then_the_previous_three(tmp_path: Path) -> None:
    class Recorder:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def sendto(self, data: bytes, _address) -> int:
            self.sent.append(data)
            return len(data)

    recorder = Recorder()
    agent = Agent(_config(tmp_path), sock=recorder)
    for seq in range(6):
        recorder.sent.clear()
        agent.tick(seq, 100.0 + 5 * seq)
        seqs = [wire.parse_header(d).seq for d in recorder.sent]
        assert seqs == [seq, *range(seq - 1, max(seq - 4, -1), -1)]


def test_a_send_that_fails_is_counted_and_does_not_stop_the_agent(tmp_path: Path) -> None:
    class Refusing:
        def sendto(self, _data: bytes, _address) -> int:
            raise OSError(105, "No buffer space available")

    agent = Agent(_config(tmp_path), sock=Refusing())
    agent.tick(0, 100.0)
    agent.tick(1, 105.0)
    assert agent.counters.send_errors == 3 and agent.counters.sent == 0


def test_every_reader_the_metric_sets_name_exists_and_counters_feed_rate_names() -> None:
    for metric_set in load_sets().values():
        for part, slots in metric_set.parts.items():
            if part == "job":
                continue  # read by the job reporter (tests/telemetry/test_telemetry_job.py)
            for slot in slots:
                assert slot.read in READERS, (metric_set.name, part, slot.read)
                scope, kind, _scale = READERS[slot.read]
                if part == "gpu":
                    assert scope == "gpu", slot
                if kind == "counter":
                    assert slot.metric.endswith(("_per_second", "_per_s")), slot


def test_recorded_capture_replays_one_step_per_period() -> None:
    capture = agent_module.CaptureSource(
        str(TOP / "tests/fixtures/real/h200-vm/under-load/query_gpu_timeseries_2hz.csv")
    )
    steps = [capture.read() for _ in range(200)]
    assert all(len(step) == 1 for step in steps)
    temperatures = {step[0]["gpu.temperature"] for step in steps}
    assert len(temperatures) > 3 and all(20 <= t <= 100 for t in temperatures)
    assert steps[0][0]["gpu.throttle_reasons"] == 1.0  # 0x...01: GPU idle
