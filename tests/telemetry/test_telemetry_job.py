"""The training job's reporter: with no torch, with torch on CPU (fragmentation absent, not zero),
through the collector into the store; it never blocks or raises into the training loop."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from stethoscope.store.client import Store
from stethoscope.store.writer import Writer
from stethoscope.telemetry import wire
from stethoscope.telemetry.job import READS, SET_ID, Reporter
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

SECRET = b"job-test-cluster-secret-0123"


def _receiver() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    return sock


def _run_steps(reporter: Reporter, steps: int, losses=None) -> None:
    for n in range(steps):
        reporter.step(samples=32, loss=(losses[n] if losses else 2.0 - n * 0.01), step_time=0.05)


def test_job_part_slots_are_the_metric_sets() -> None:
    metric_set = load_sets()["gpu_node"]
    assert tuple(slot.read for slot in metric_set.parts["job"]) == READS
    assert len(READS) == 6 and metric_set.id == SET_ID  # the reporter's default set is the shipped one


def test_reporter_with_no_torch_installed_sends_its_part(tmp_path: Path) -> None:
    receiver = _receiver()
    port = receiver.getsockname()[1]
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "chdb", "clickhouse_connect", "yaml"):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        from stethoscope.telemetry.job import Reporter
        r = Reporter(job_id="4242", rank=3, collector="127.0.0.1:{port}", node_key=5, key=b"k" * 32, period=0)
        for n in range(5):
            r.step(samples=64, loss=1.0 + n, step_time=0.1)
        print(r.sent, r.dropped, r.errors)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    sent, dropped, errors = map(int, run.stdout.split())
    assert sent > 0 and dropped == 0 and errors == 0
    sample = wire.decode(receiver.recv(2048), lambda _k: [b"k" * 32], int(time.time() * 1000))
    assert isinstance(sample, wire.Sample)
    assert (sample.header.part, sample.header.job, sample.header.rank) == (wire.JOB_PART, 4242, 3)
    step_ms, throughput, _variance, frag, comm_ms, data_ms = sample.values
    assert step_ms == pytest.approx(100.0) and throughput > 0
    assert math.isnan(frag) and math.isnan(comm_ms) and math.isnan(data_ms)  # not measured: absent


def test_reporter_with_torch_on_cpu_leaves_fragmentation_absent_not_zero() -> None:
    torch = pytest.importorskip("torch", reason="the dev extra's CPU torch is not installed here")
    assert not torch.cuda.is_available()
    receiver = _receiver()
    key = b"t" * 32
    reporter = Reporter(
        job_id="train-run",
        collector="127.0.0.1:%d" % receiver.getsockname()[1],
        node_key=1,
        key=key,
        period=0,
    )
    reporter.step(samples=8, loss=torch.tensor(0.75), step_time=0.2)
    reporter.step(samples=8, loss=torch.tensor(1.25), step_time=0.2)
    datagrams = [receiver.recv(2048) for _ in range(reporter.sent)]
    newest = max(datagrams, key=lambda d: wire.parse_header(d).seq)
    sample = wire.decode(newest, lambda _k: [key], wire.parse_header(newest).ts_ms)
    assert isinstance(sample, wire.Sample)
    assert reporter.errors == 0
    assert math.isnan(sample.values[3])  # no CUDA: absent, not 0
    assert sample.values[2] == pytest.approx(0.0625)  # variance of 0.75 and 1.25


def test_full_socket_buffer_drops_the_sample_and_counts_it() -> None:
    class FullBuffer:
        def sendto(self, _data: bytes, _address) -> int:
            raise BlockingIOError(11, "Resource temporarily unavailable")

    reporter = Reporter(
        job_id="1", collector="127.0.0.1:9", node_key=1, key=b"x" * 32, period=0, sock=FullBuffer()
    )
    _run_steps(reporter, 3)
    assert reporter.dropped > 0 and reporter.sent == 0 and reporter.errors == 0


def test_bad_loss_values_never_raise_into_the_training_loop() -> None:
    reporter = Reporter(job_id="1", collector="127.0.0.1:9", node_key=1, key=b"x" * 32, period=0)
    reporter.step(samples=1, loss="not a number")
    reporter.step(samples=object(), loss=float("nan"))
    assert reporter.errors == 2


def _stream_job_rows(tmp_path: Path, steps) -> tuple[list, Collector]:
    """Run a reporter against a real collector on loopback writing into a real store; its rows."""
    metric_set = load_sets()["gpu_node"]
    keyring = Keyring({9: "node09"}, [SECRET])
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    collector = Collector(keyring, {metric_set.id: metric_set}, Writer(dsn, tmp_path / "spool").write)
    collector.start()
    node_key, key = keyring.key_for("node09")
    host, port = collector.address
    reporter = Reporter(
        job_id="778", rank=1, collector=f"{host}:{port}", node_key=node_key, key=key, period=0
    )
    for step in steps:
        reporter.step(samples=16, loss=1.0, **step)
        time.sleep(0.005)  # one report per step, each at its own millisecond (rows differ by time)
    deadline = time.time() + 10
    while collector.stats.received["node09"] < len(steps) and time.time() < deadline:
        time.sleep(0.05)
    collector.stop()
    with Store(dsn) as store:
        rows = store.query(
            f"SELECT metric_name, device, labels, value FROM {database}.metrics WHERE node_id = 'node09' "
            "AND labels['source'] = 'stream' ORDER BY metric_name, timestamp"
        )
    return rows, collector


def test_allreduce_and_data_wait_travel_from_the_reporter_to_the_store_in_ms(tmp_path: Path) -> None:
    steps = [{"step_time": 0.4, "comm_time": 0.1 + n * 0.01, "data_time": 0.02} for n in range(4)]
    rows, collector = _stream_job_rows(tmp_path, steps)
    assert collector.stats.rejected == {}  # the reporter's default set is the collector's
    by_name: dict[str, list[float]] = {}
    for name, device, labels, value in rows:
        assert device == "job" and labels["job"] == "778" and labels["rank"] == "1"
        by_name.setdefault(name, []).append(value)
    assert by_name["train_allreduce_latency_ms"] == pytest.approx([100.0, 110.0, 120.0, 130.0], rel=1e-5)
    assert by_name["train_data_wait_ms"] == pytest.approx([20.0] * 4, rel=1e-5)
    assert by_name["train_step_time_ms"] == pytest.approx([400.0] * 4, rel=1e-5)


def test_job_rows_reach_the_store_with_job_and_rank_labels(tmp_path: Path) -> None:
    metric_set = load_sets()["gpu_node"]
    keyring = Keyring({9: "node09"}, [SECRET])
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    collector = Collector(keyring, {metric_set.id: metric_set}, Writer(dsn, tmp_path / "spool").write)
    collector.start()
    node_key, key = keyring.key_for("node09")
    host, port = collector.address
    reporter = Reporter(
        job_id="777", rank=2, collector=f"{host}:{port}", node_key=node_key, key=key, period=0
    )
    _run_steps(reporter, 6)
    deadline = time.time() + 10
    while collector.stats.received["node09"] < 6 and time.time() < deadline:
        time.sleep(0.05)
    collector.stop()
    with Store(dsn) as store:
        rows = store.query(
            f"SELECT metric_name, device, labels FROM {database}.metrics WHERE node_id = 'node09' "
            "AND labels['source'] = 'stream' ORDER BY metric_name"
        )
    names = {name for name, _device, _labels in rows}
    assert names == {"train_step_time_ms", "train_throughput_samples_per_second", "train_loss_variance"}
    assert all(
        device == "job" and labels["job"] == "777" and labels["rank"] == "2" for _n, device, labels in rows
    )
