"""One meaning per metric name and one device naming per kind (docs/design.md "Metric catalog"): the
real collectors' rows (the module_utils collectors on the recorded fixtures) and the push agent's
stream rows (through the real collector) are run through the catalog: every name is catalogued with
the kind its rows imply, and every device follows its catalog kind's naming."""

from __future__ import annotations

import math
import re
import shutil
import time
from pathlib import Path

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils import (
    collect_gpu,
    collect_nvlink,
    collect_rdma,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context
from stethoscope.catalog import Catalog
from stethoscope.paths import h200_capture
from stethoscope.store.batch import Batch
from stethoscope.store.writer import WriteReport
from stethoscope.telemetry.agent import Agent, CaptureSource
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

from conftest import FIXTURES, fixture_text

CATALOG = Catalog.load()
GPUD = FIXTURES / "public/sysfs/sys-class-infiniband-h100_gpud"  # ConnectX-7 HCAs, one port each
SECRET = b"s" * 32
STREAM_DEVICES = {"node", "job"}  # node-part aggregates (label agg) and job parts: docs "Telemetry"


def ib_root(tmp_path: Path) -> Path:
    """A node root whose /sys/class/infiniband is a copy of the recorded ConnectX-7 tree."""
    root = tmp_path / "root"
    shutil.copytree(GPUD, root / "sys/class/infiniband", symlinks=True)
    return root


def bump(root: Path, counter: str, by: int) -> None:
    for path in root.glob(f"sys/class/infiniband/*/ports/*/{counter}"):
        path.write_text(f"{int(path.read_text().split()[0]) + by}\n")


def context(root: Path, state: Path, clock: list[float], outputs=None) -> Context:
    outputs = outputs or {}
    return Context(
        lambda argv, _timeout, _env=None: (*outputs.get(tuple(argv), (127, "")), ""),
        lambda name: f"/usr/bin/{name}" if any(argv[0] == name for argv in outputs) else None,
        root=str(root),
        state_dir=str(state),
        check_mode=False,
        clock=lambda: clock[0],
    )


def sweep_rows(tmp_path: Path) -> list[dict]:
    """The sweep collectors' rows: RDMA on the ConnectX-7 sysfs tree (two sweeps: rates need two),
    GPU on the real H200's commands, NVLink on a published 8xA100 status."""
    root, clock = ib_root(tmp_path), [1000.0]
    rows = list(collect_rdma.collect(context(root, tmp_path / "state", clock))["metrics"])
    bump(root, "hw_counters/out_of_buffer", 600)
    clock[0] += 60
    rows += collect_rdma.collect(context(root, tmp_path / "state", clock))["metrics"]
    h200 = {
        ("nvidia-smi", "-q", "-x"): (0, fixture_text("real/h200-vm/commands/nvidia-smi_-q_-x.xml")),
        ("nvidia-smi", "dmon", "-c", "1", "-s", "pucvmet"): (
            0,
            fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt"),
        ),
        ("dmesg",): (0, fixture_text("real/h200-vm/commands/dmesg_nvrm_lines.txt")),
    }
    gpu_root = tmp_path / "gpu"
    (gpu_root / "proc/sys/kernel/random").mkdir(parents=True)
    (gpu_root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")
    ctx = context(gpu_root, tmp_path / "gpu-state", clock, h200)
    rows += collect_gpu.collect(ctx)["metrics"]
    nvlink = {
        ("nvidia-smi", "nvlink", "-s"): (0, fixture_text("public/nvidia-smi/nvlink_status_8xA100_gpud.txt")),
        ("nvidia-smi", "nvlink", "-e"): (0, ""),
        ("nvidia-smi", "nvlink", "-gt", "d"): (0, ""),
    }
    rows += collect_nvlink.collect(context(gpu_root, tmp_path / "nvlink-state", clock, nvlink))["metrics"]
    return rows


def stream_rows(tmp_path: Path) -> list[dict]:
    """The push agent's rows as the collector stores them: the agent reads the ConnectX-7 tree and
    replays the recorded H200 capture, two periods (rates need two), over UDP on loopback to the real
    collector, whose batches are kept as its writer would receive them."""
    root = ib_root(tmp_path)
    metric_set = load_sets()["gpu_node"]
    keyring = Keyring({1: "node01"}, [SECRET])
    number, key = keyring.key_for("node01")
    batches: list[Batch] = []

    def keep(batch: Batch) -> WriteReport:
        batches.append(batch)
        return WriteReport(stored=len(batch.metrics))

    now = time.time()
    collector = Collector(keyring, {metric_set.id: metric_set}, keep, clock=lambda: now).start()
    host, port = collector.address
    config = {
        "collector": f"{host}:{port}",
        "node_id": "node01",
        "node_key": number,
        "key": key.hex(),
        "set": metric_set.render(),
        "root": str(root),
        "gpu_source": "none",
    }
    agent = Agent(config, gpu_source=CaptureSource(str(h200_capture())))
    try:
        agent.tick(0, now - 5)
        bump(root, "hw_counters/out_of_buffer", 50)
        agent.tick(1, now)
        deadline = time.time() + 10
        while collector.stats.received["node01"] < 2 and time.time() < deadline:
            time.sleep(0.02)
    finally:
        collector.stop()
    return [
        {"name": name, "device": device, "labels": labels, "value": value}
        for batch in batches
        for name, device, labels, value in zip(
            batch.metrics.metric_name,
            batch.metrics.device,
            batch.metrics.labels,
            batch.metrics.value,
            strict=True,
        )
        if labels.get("source") == "stream"  # not the collector's own counters of what it received
    ]


def problems(rows: list[dict], stream: bool) -> list[str]:
    found = []
    for row in rows:
        name, device = row["name"], row["device"]
        spec = CATALOG.get(name)
        if spec is None:
            found.append(f"{name}: not in the catalog")
            continue
        cumulative = spec.kind in ("counter", "events")
        if stream and cumulative:  # the agent sends rates, stored under the catalog's gauge names
            found.append(f"{name}: the stream sends a {spec.kind}")
        if cumulative != name.endswith("_total") and not name.startswith("smart_"):
            found.append(f"{name}: kind {spec.kind} but its name says otherwise")
        kind = CATALOG.device_kind(name)
        if kind is None or (stream and device in STREAM_DEVICES):
            continue
        if not re.fullmatch(kind.pattern, device):
            found.append(f"{name} on {device!r}: not a {kind.name} ({kind.pattern})")
    return sorted(set(found))


def test_every_sweep_row_is_catalogued_with_its_kind_and_device_naming(tmp_path: Path) -> None:
    rows = sweep_rows(tmp_path)
    names = {row["name"] for row in rows}
    assert {"rdma_qps_dropped_per_second", "rdma_out_of_buffer_total", "ib_port_state"} <= names
    assert {"gpu_temperature_celsius", "nvlink_link_up"} <= names
    assert problems(rows, stream=False) == []


def test_every_stream_row_is_catalogued_with_its_kind_and_device_naming(tmp_path: Path) -> None:
    rows = stream_rows(tmp_path)
    names = {row["name"] for row in rows}
    assert {"rdma_qps_dropped_per_second", "ib_port_state", "gpu_temperature_celsius"} <= names
    assert {row["device"] for row in rows} >= {"node", "gpu0"}
    assert problems(rows, stream=True) == []


def test_the_rdma_port_is_one_device_naming_everywhere(tmp_path: Path) -> None:
    """Regression: the catalog put rdma_* on the bare HCA (`mlx5_0`), as the knowledge base's RDMA
    cases did, while the collector writes the port (`mlx5_0/1`)."""
    port = CATALOG.device_kinds["hca_port"]
    rdma = {row["device"] for row in sweep_rows(tmp_path) if row["name"].startswith(("rdma_", "ib_"))}
    assert "mlx5_0/1" in rdma and len(rdma) == len(list(GPUD.glob("*/ports/*")))
    assert all(re.fullmatch(port.pattern, device) for device in rdma)
    assert CATALOG.device_kind("rdma_qp_error_count") is port
    assert CATALOG.device_kind("ib_port_state") is port
    assert CATALOG.enclosing("rdma_qps_dropped_per_second").name == "hca"
    from test_knowledge_base import CASES

    devices = {
        spec[1]
        for fires, quiet in CASES.values()
        for spec in [*fires, *quiet]
        if spec[0].startswith(("rdma_", "ib_"))
    }
    assert devices and all(re.fullmatch(port.pattern, device) for device in devices), devices


def test_rdma_drops_mean_the_same_in_the_sweep_and_the_stream(tmp_path: Path) -> None:
    """Regression: the stream sent out_of_buffer alone under rdma_qps_dropped_per_second, the sweep
    out_of_buffer + rx_discards_phy. Both count the same counters of a port now: 30 drops/s from
    out_of_buffer and 20 from rx_discards_phy (where a driver exposes it there) are 50 in both."""
    root, clock = ib_root(tmp_path), [1000.0]
    port = root / "sys/class/infiniband/mlx5_0/ports/1/hw_counters"
    (port / "rx_discards_phy").write_text("1000\n")
    collect_rdma.collect(context(root, tmp_path / "state", clock))
    metric_set = load_sets()["gpu_node"]
    agent = Agent(
        {
            "collector": "127.0.0.1:9",
            "node_key": 1,
            "key": "00" * 32,
            "set": metric_set.render(),
            "root": str(root),
            "gpu_source": "none",
        }
    )
    slot = [s["metric"] for s in agent.metric_set["parts"]["node"]].index("rdma_qps_dropped_per_second")
    assert math.isnan(agent.sample(100.0)[0][slot])
    bump(root, "hw_counters/out_of_buffer", 30 * 60)
    (port / "rx_discards_phy").write_text(f"{1000 + 20 * 60}\n")
    clock[0] += 60
    swept = {
        row["device"]: row["value"]
        for row in collect_rdma.collect(context(root, tmp_path / "state", clock))["metrics"]
        if row["name"] == "rdma_qps_dropped_per_second"
    }
    streamed = agent.sample(160.0)[0][slot]
    assert swept.pop("mlx5_0/1") == pytest.approx(50.0)
    assert swept and all(value == pytest.approx(30.0) for value in swept.values())
    swept["mlx5_0/1"] = 50.0
    assert streamed == pytest.approx(sum(swept.values()))  # the node part sums the node's ports
