"""The seam of issue 21, end to end with real parts: the ranks of one synchronous job, each node
running the push agent (stethoscope/telemetry/agent.py, the file the push_agent role copies, its GPU
source the real H200 capture) and the job's reporter (telemetry/job.py, the job part) -> UDP on
loopback -> a real Collector -> the store (embedded ClickHouse) -> read_windows -> the shipped model
and the job-relative detector -> one finding naming the culprit rank, none for its waiting peers.

Ten minutes of 5-second periods are replayed at full speed: the agents' and reporters' clocks and
the collector's (its freshness check) are the replay's own clock, everything else is as it runs."""

from __future__ import annotations

import json
import random
import time
import uuid
from pathlib import Path

import pytest

from stethoscope.model.findings import run_model
from stethoscope.model.metadata import load, metadata_path
from stethoscope.store.client import Store
from stethoscope.store.writer import Writer
from stethoscope.telemetry.agent import Agent, CaptureSource
from stethoscope.telemetry.collector import Collector
from stethoscope.telemetry.job import Reporter
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets

TOP = Path(__file__).resolve().parents[1]
CAPTURE = TOP / "tests/fixtures/real/h200-vm/under-load/query_gpu_timeseries_2hz.csv"
SECRET = b"seam-test-cluster-secret"
RANKS = 8
CULPRIT = 5
JOB = "7701"
PERIODS = 130  # 10 minutes and a little before
ONSET = 50  # the straggler computes 30 % longer from this period on
PERIOD_S = 5.0


class ReplayClock:
    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now


def _times(rng: random.Random, period: int) -> list[tuple[float, float, float]]:
    """Per rank (step, collective, input) in seconds of one synchronous step: each rank computes and
    waits for its input, then waits in the collective for the last one plus the transfer."""
    compute = [0.30 * (1 + rng.gauss(0, 0.004)) for _ in range(RANKS)]
    if period >= ONSET:
        compute[CULPRIT] *= 1.3
    data = [0.01 * rng.lognormvariate(0, 0.3) for _ in range(RANKS)]
    arrival = [c + d for c, d in zip(compute, data, strict=True)]
    step = max(arrival) + 0.06
    return [(step, step - a, d) for a, d in zip(arrival, data, strict=True)]


@pytest.mark.slow
def test_agents_to_a_finding_that_names_the_straggler_rank_and_not_its_peers(tmp_path: Path) -> None:
    nodes = {k + 1: f"j-{k:02d}" for k in range(RANKS)}
    keyring = Keyring(dict(nodes), [SECRET])
    metric_set = load_sets()["gpu_node"]
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    start = float(int(time.time()) - PERIODS * PERIOD_S - 60)
    clock = ReplayClock(start)
    collector = Collector(
        keyring,
        {metric_set.id: metric_set},
        Writer(dsn, tmp_path / "spool").write,
        flush_interval=0.2,
        clock=clock,
    ).start()
    host, port = collector.address
    root = tmp_path / "root"  # no IB, AER or NVMe under it: those slots are missing, never zero
    root.mkdir()
    agents, reporters = [], []
    for rank, (node_key, node) in enumerate(sorted(nodes.items())):
        _, key = keyring.key_for(node)
        config = {
            "collector": f"{host}:{port}",
            "node_id": node,
            "node_key": node_key,
            "key": key.hex(),
            "set": metric_set.render(),
            "root": str(root),
            "gpu_parts": False,
            "boot_epoch": int(start),
        }
        agents.append(Agent(config, gpu_source=CaptureSource(str(CAPTURE))))
        reporters.append(Reporter(JOB, rank, f"{host}:{port}", node_key, key, period=0, clock=clock))
    rng = random.Random(7)
    try:
        for period in range(PERIODS):
            clock.now = start + period * PERIOD_S
            for agent in agents:
                agent.tick(period, clock.now)
            for reporter, (step, comm, data) in zip(reporters, _times(rng, period), strict=True):
                reporter.step(samples=64, loss=1.0, step_time=step, comm_time=comm, data_time=data)
            time.sleep(0.003)  # the collector's socket buffer, not the test's clock, sets this pace
        deadline = time.time() + 20
        while sum(collector.stats.received.values()) < 2 * RANKS * PERIODS and time.time() < deadline:
            time.sleep(0.05)
    finally:
        collector.stop()
    assert not collector.stats.rejected, collector.stats.rejected
    end_ms = int(clock.now * 1000) + 1000
    detail = json.dumps({"gpu": {"models": ["NVIDIA H200"], "count": 1}})
    with Store(dsn) as store:
        store.insert_rows(
            "fingerprints",
            [
                {
                    "fingerprint": "h200",
                    "kind": "class",
                    "node_id": n,
                    "detail": detail,
                    "first_seen": int(start * 1000),
                }
                for n in nodes.values()
            ],
        )
        store.insert_rows(
            "nodes",
            [
                {
                    "node_id": n,
                    "slurm_name": n,
                    "rack": f"rack{i // 4}",
                    "switch": f"leaf{i // 4}",
                    "groups": [],
                    "updated_at": int(start * 1000),
                }
                for i, n in enumerate(nodes.values())
            ],
        )
        run = run_model(store, end_ms, meta=load(metadata_path()))

    culprit_node = nodes[CULPRIT + 1]
    named = [f for f in run.findings if f.rule_id == "model.job"]
    assert [(f.job, f.rank, f.node_id, f.layer) for f in named] == [
        (JOB, str(CULPRIT), culprit_node, "compute")
    ]
    assert f"job {JOB}: rank {CULPRIT} on {culprit_node} slows 7 ranks: compute" in named[0].detail
    assert named[0].held_back == [str(r) for r in range(RANKS) if r != CULPRIT]
    peers = set(nodes.values()) - {culprit_node}
    assert [f for f in run.findings if f.node_id in peers] == []
