"""Where the node graphs meet the job-relative detector, end to end with real parts: the ranks of one
synchronous job, each node running the push agent (stethoscope/telemetry/agent.py, the file the
push_agent role copies, its GPU source the real H200 capture) and the job's reporter (telemetry/job.py,
the job part) -> UDP on loopback -> a real Collector -> the store (embedded ClickHouse) -> read_windows ->
the shipped model and the job-relative detector -> one finding naming the culprit rank, none for its
waiting peers. Jobs run several ranks a node: with two, each node's agent streams beside two reporters, and an
input stall on both ranks of one node is that node's one finding naming both.

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
from stethoscope.telemetry.job import Reporter
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

TOP = Path(__file__).resolve().parents[2]
CAPTURE = TOP / "tests/fixtures/real/h200-vm/under-load/query_gpu_timeseries_2hz.csv"
SECRET = b"seam-test-cluster-secret"
RANKS = 8
JOB = "7701"
PERIODS = 130  # 10 minutes and a little before
ONSET = 50  # the fault starts at this period
PERIOD_S = 5.0
# (ranks a node, the culprit ranks, what they do from the onset: "compute" 30 % longer, or "input":
# wait 100 ms longer for their input)
CASES = {"straggler": (1, (5,), "compute"), "node_input_stall": (2, (2, 3), "input")}


class ReplayClock:
    def __init__(self, start: float):
        self.now = start

    def __call__(self) -> float:
        return self.now


def _times(rng: random.Random, period: int, culprits, kind: str) -> list[tuple[float, float, float]]:
    """Per rank (step, collective, input) in seconds of one synchronous step: each rank computes and
    waits for its input, then waits in the collective for the last one plus the transfer."""
    compute = [0.30 * (1 + rng.gauss(0, 0.004)) for _ in range(RANKS)]
    data = [0.01 * rng.lognormvariate(0, 0.3) for _ in range(RANKS)]
    for culprit in culprits if period >= ONSET else ():
        if kind == "compute":
            compute[culprit] *= 1.3
        else:
            data[culprit] += 0.1
    arrival = [c + d for c, d in zip(compute, data, strict=True)]
    step = max(arrival) + 0.06
    return [(step, step - a, d) for a, d in zip(arrival, data, strict=True)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_agents_to_a_finding_that_names_the_culprit_ranks_and_not_their_peers(tmp_path: Path, case) -> None:
    per_node, culprits, kind = CASES[case]
    nodes = {k + 1: f"j-{k:02d}" for k in range(RANKS // per_node)}
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
    for node_key, node in sorted(nodes.items()):
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
        for rank in range((node_key - 1) * per_node, node_key * per_node):  # the node's ranks
            reporters.append(Reporter(JOB, rank, f"{host}:{port}", node_key, key, period=0, clock=clock))
    rng = random.Random(7)
    try:
        for period in range(PERIODS):
            clock.now = start + period * PERIOD_S
            for agent in agents:
                agent.tick(period, clock.now)
            times = _times(rng, period, culprits, kind)
            for reporter, (step, comm, data) in zip(reporters, times, strict=True):
                reporter.step(samples=64, loss=1.0, step_time=step, comm_time=comm, data_time=data)
            time.sleep(0.003)  # the collector's socket buffer, not the test's clock, sets this pace
        deadline = time.time() + 20
        expected = (len(nodes) + RANKS) * PERIODS
        while sum(collector.stats.received.values()) < expected and time.time() < deadline:
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

    culprit_node = nodes[culprits[0] // per_node + 1]
    layer = "compute" if kind == "compute" else "storage"
    named = [f for f in run.findings if f.rule_id == "model.job"]
    assert [(f.job, f.ranks, f.node_id, f.layer) for f in named] == [
        (JOB, [str(r) for r in culprits], culprit_node, layer)
    ]
    who = f"rank {culprits[0]} on {culprit_node} slows"
    if len(culprits) > 1:
        who = f"ranks {culprits[0]}-{culprits[-1]} on {culprit_node} slow"
    assert f"job {JOB}: {who} {RANKS - len(culprits)} ranks: {layer}" in named[0].detail
    assert named[0].held_back == [str(r) for r in range(RANKS) if r not in culprits]
    peers = set(nodes.values()) - {culprit_node}
    assert [f for f in run.findings if f.node_id in peers] == []
