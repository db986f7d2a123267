"""End to end on loopback: lab agents -> collector -> store (embedded ClickHouse), with and without a
lossy send path (the agents' sockets wrapped at the boundary, dropping datagrams at random)."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from stethoscope.store.batch import Batch
from stethoscope.store.client import Store
from stethoscope.store.writer import Writer, WriteReport
from stethoscope.telemetry import wire
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.lab import lab_agents, run_agents
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

TOP = Path(__file__).resolve().parents[2]
NODES = {1: "node01", 2: "node02", 3: "node05"}  # an H200 without IB, one with IB + AER, an A100
SECRET = b"stream-test-cluster-secret"
PERIOD = 0.2


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("lab")
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(directory)}
    subprocess.run([sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "5"], env=env, check=True)
    return directory


class LossySocket:
    """The agent's send path at the socket boundary: drops a fraction of datagrams, records all."""

    def __init__(self, sock, drop: float, rng: random.Random):
        self.sock, self.drop, self.rng = sock, drop, rng
        self.sent: list[tuple[bytes, bool]] = []

    def sendto(self, data: bytes, address) -> int:
        delivered = self.rng.random() >= self.drop
        self.sent.append((data, delivered))
        return self.sock.sendto(data, address) if delivered else len(data)


def _stream(lab: Path, tmp_path: Path, duration: float, drop: float = 0.0, seed: int = 11):
    keyring = Keyring(dict(NODES), [SECRET])
    metric_set = load_sets()["gpu_node"]
    dsn, database = f"chdb://{tmp_path / 'db'}", f"t_{uuid.uuid4().hex[:8]}"
    writer = Writer(f"{dsn}?database={database}", tmp_path / "spool")
    collector = Collector(keyring, {metric_set.id: metric_set}, writer.write, flush_interval=0.2).start()
    host, port = collector.address
    agents = lab_agents(keyring, metric_set, f"{host}:{port}", period=PERIOD, directory=lab)
    assert len(agents) == len(NODES)
    rng = random.Random(seed)
    for agent in agents:
        agent.sock = LossySocket(agent.sock, drop, rng)
    run_agents(agents, duration)
    collector.stop()
    return keyring, metric_set, agents, collector, Store(dsn, database)


def _samples(agents) -> dict[tuple[int, int, int], tuple[wire.Sample, bool]]:
    """Every sample the agents made: (node key, part, seq) -> (sample, whether any copy got through)."""
    samples: dict[tuple[int, int, int], tuple[wire.Sample, bool]] = {}
    for agent in agents:
        for data, delivered in agent.sock.sent:
            sample = wire.decode(data, lambda _k, a=agent: [a.key], int(wire_time(data)))
            assert isinstance(sample, wire.Sample)
            key = (sample.header.node_key, sample.header.part, sample.header.seq)
            previous = samples.get(key, (sample, False))
            samples[key] = (sample, previous[1] or delivered)
    return samples


def max_seq_sent_before(agent, data: bytes) -> int:
    """The newest sequence the agent had made when it sent `data` (a new sample is sent first)."""
    newest = -1
    for sent, _ok in agent.sock.sent:
        newest = max(newest, wire.parse_header(sent).seq)
        if sent is data:
            return newest
    raise AssertionError("not sent")


def wire_time(data: bytes) -> int:
    header = wire.parse_header(data)
    assert isinstance(header, wire.Header)
    return header.ts_ms


def _expected_rows(samples, metric_set, keyring) -> set[tuple[str, str, str, int]]:
    rows = set()
    for (node_key, part, _seq), (sample, delivered) in samples.items():
        if not delivered:
            continue
        device = "node" if part == 0 else f"gpu{part - 1}"
        for slot, value in zip(metric_set.slots(part), sample.values, strict=True):
            if not math.isnan(value):
                rows.add((keyring.node_of(node_key), slot.metric, device, sample.header.ts_ms))
    return rows


def _stored_rows(store: Store) -> list[tuple[str, str, str, int]]:
    with store:
        return [
            tuple(row)
            for row in store.query(
                f"SELECT node_id, metric_name, device, toUnixTimestamp64Milli(timestamp) "
                f"FROM {store.database}.metrics WHERE labels['source'] = 'stream'"
            )
        ]


def _health(store: Store, metric: str) -> dict[str, float]:
    with store:
        return dict(
            store.query(
                f"SELECT node_id, argMax(value, timestamp) FROM {store.database}.metrics "
                "WHERE metric_name = {m:String} GROUP BY node_id",
                {"m": metric},
            )
        )


def test_every_sample_of_a_lab_run_stored_exactly_once(lab: Path, tmp_path: Path) -> None:
    keyring, metric_set, agents, collector, store = _stream(lab, tmp_path, duration=2.0)
    samples = _samples(agents)
    assert len({seq for (_k, _p, seq) in samples}) >= 5  # several periods ran
    assert {part for (_k, part, _s) in samples} == {0, 1}  # the node part and the lab's one GPU
    expected = _expected_rows(samples, metric_set, keyring)
    stored = _stored_rows(store)
    assert len(stored) == len(set(stored)), "a sample was stored twice"
    assert set(stored) == expected
    assert collector.stats.duplicates > 0  # the resends came and were folded
    assert collector.stats.spooled == 0
    assert _health(store, "telemetry_packets_lost_total") == dict.fromkeys(NODES.values(), 0.0)
    received = _health(store, "telemetry_packets_received_total")
    per_node = defaultdict(int)
    for node_key, _part, _seq in samples:
        per_node[keyring.node_of(node_key)] += 1
    assert received == {node: float(n) for node, n in per_node.items()}


def test_resends_recover_a_fifth_of_datagrams_dropped_and_loss_counts_the_rest(
    lab: Path, tmp_path: Path
) -> None:
    keyring, metric_set, agents, _collector, store = _stream(lab, tmp_path, duration=3.0, drop=0.2)
    samples = _samples(agents)
    dropped = sum(1 for agent in agents for _d, ok in agent.sock.sent if not ok)
    assert dropped > 0.1 * sum(len(agent.sock.sent) for agent in agents)
    first_copy_dropped = {
        (header.node_key, header.part, header.seq)
        for agent in agents
        for data, ok in agent.sock.sent
        if not ok and (header := wire.parse_header(data)).seq == max_seq_sent_before(agent, data)
    }
    recovered = {key for key in first_copy_dropped if samples[key][1]}
    assert recovered, "no sample needed its resends: the run shows nothing"
    stored = _stored_rows(store)
    assert len(stored) == len(set(stored))
    assert set(stored) == _expected_rows(samples, metric_set, keyring)
    # lost: samples no copy delivered, once no copy can come any more (REDUNDANCY periods later)
    lost: dict[str, int] = defaultdict(int)
    streams: dict[tuple[int, int], set[int]] = defaultdict(set)
    for (node_key, part, seq), (_sample, delivered) in samples.items():
        if delivered:
            streams[(node_key, part)].add(seq)
    for (node_key, _part), seqs in streams.items():
        final = set(range(min(seqs), max(seqs) - wire.REDUNDANCY))
        lost[keyring.node_of(node_key)] += len(final - seqs)
    assert _health(store, "telemetry_packets_lost_total") == {n: float(lost[n]) for n in NODES.values()}
    print(f"dropped {dropped} datagrams, recovered {len(recovered)} samples, lost {sum(lost.values())}")


def test_forged_replayed_and_unknown_datagrams_counted_by_reason_and_never_stored(tmp_path: Path) -> None:
    keyring = Keyring(dict(NODES), [SECRET])
    metric_set = load_sets()["gpu_node"]
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    collector = Collector(keyring, {metric_set.id: metric_set}, Writer(dsn, tmp_path / "spool").write)
    now = collector.clock()
    _, key = keyring.key_for("node01")
    fields = {"set_id": metric_set.id, "node_key": 1, "part": 0, "boot_epoch": 500, "ts_ms": int(now * 1000)}
    good = [
        wire.encode(
            key, seq=seq, values=[40.0 + seq], **{**fields, "ts_ms": fields["ts_ms"] + 5000 * (seq - 9)}
        )
        for seq in range(10)
    ]
    assert collector.handle(good[0]) is None
    assert collector.handle(good[9]) is None
    assert collector.handle(good[0]) == wire.REPLAYED  # an old sequence replayed
    assert collector.handle(good[9]) == "duplicate"
    forged = wire.encode(wire.node_secret(b"not-the-secret", "node01"), seq=20, values=[99.0], **fields)
    assert collector.handle(forged) == wire.MAC
    unknown = wire.encode(key, seq=21, values=[99.0], **{**fields, "node_key": 4000})
    assert collector.handle(unknown) == wire.KEY
    other_version = bytearray(wire.encode(key, seq=22, values=[99.0], **fields))
    other_version[2] = 2
    assert collector.handle(bytes(other_version)) == wire.VERSION_REASON
    other_set = wire.encode(key, seq=23, values=[99.0], **{**fields, "set_id": 77})
    assert collector.handle(other_set) == wire.SET
    collector.stop()
    with Store(dsn) as store:
        values = store.query(
            f"SELECT value FROM {database}.metrics WHERE metric_name = 'gpu_temperature_celsius'"
        )
        rejected = dict(
            store.query(
                f"SELECT labels['reason'], value FROM {database}.metrics "
                "WHERE metric_name = 'telemetry_packets_rejected_total' AND device = 'collector'"
            )
        )
        claimed = store.query(f"SELECT count() FROM {database}.metrics WHERE node_id = ''")
    assert sorted(v for (v,) in values) == [40.0, 49.0]
    assert {r: rejected[r] for r in ("replayed", "mac", "key", "version", "set")} == dict.fromkeys(
        ("replayed", "mac", "key", "version", "set"), 1.0
    )
    assert claimed == [(0,)]


def test_a_write_slower_than_the_flush_interval_is_followed_at_once_not_after_a_further_interval() -> None:
    """Regression: the writing thread slept a whole flush interval after each write, however long the
    write took, so a slow store added an idle second to every write cycle and the rows waiting for it
    (2,000 eight-GPU nodes fell behind: benchmarks/stream_scale.py). Here each write takes 5 s of the
    collector's clock."""
    now = [1_000_000.0]
    calls: list[float] = []

    def slow_sink(batch: Batch) -> WriteReport:
        calls.append(now[0])
        now[0] += 5.0  # the write's duration, as the collector's clock sees it
        return WriteReport(stored=len(batch))

    metric_set = load_sets()["gpu_node"]
    keyring = Keyring(dict(NODES), [SECRET])
    collector = Collector(
        keyring,
        {metric_set.id: metric_set},
        slow_sink,
        flush_interval=1.0,
        health_interval=0.0,
        clock=lambda: now[0],
    )
    collector.start()
    time.sleep(1.6)  # real time: one interval before the first write, then the writes back to back
    collector.stop()
    assert len(calls) >= 4, calls  # each flush writes the collector's health rows (health_interval 0)
