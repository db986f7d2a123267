"""The stream's identity against clock moves and cardinality: a node whose
clock moved back is not locked out (the agent's boot epoch is a persisted counter, and the collector
re-synchronises a stream refused as replayed for a bounded time while it sends fresh, signed
datagrams), exact replays stay refused after that, every refusal of an authenticated datagram names
its node, and the (job, rank) streams one node key may hold are capped, the evictions counted for it."""

from __future__ import annotations

import logging
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from stethoscope.serve.exposition import node_refusal_families
from stethoscope.store.writer import WriteReport
from stethoscope.telemetry import wire
from stethoscope.telemetry.agent import Agent
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

SECRET = b"stream-identity-secret-0123456789"
NODES = {1: "node01", 2: "node02"}
T0 = 1_750_000_000.0  # the true time when the test starts
HOUR = 3600.0
SET_ID = load_sets()["gpu_node"].id


class Outbox:
    """The agent's socket: what it sends, in order."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def sendto(self, data: bytes, _address: tuple) -> None:
        self.sent.append(data)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _collector(clock: Clock) -> Collector:
    metric_set = load_sets()["gpu_node"]
    keyring = Keyring(dict(NODES), [SECRET])
    return Collector(
        keyring, {metric_set.id: metric_set}, lambda b: WriteReport(stored=len(b.metrics)), clock=clock
    )


def _agent(tmp_path: Path, node_clock: Clock, state_dir: Path | None = None) -> Agent:
    node_key, key = Keyring(dict(NODES), [SECRET]).key_for("node01")
    config = {
        "collector": "127.0.0.1:9",
        "node_id": "node01",
        "node_key": node_key,
        "key": key.hex(),
        "set": load_sets()["gpu_node"].render(),
        "root": str(tmp_path),
        "gpu_source": "none",
    }
    if state_dir is not None:
        config["state_dir"] = str(state_dir)
    return Agent(config, sock=Outbox(), clock=node_clock)


def _period(agent: Agent, seq: int, node_now: float, collector: Collector) -> list[str | None]:
    """One period of the agent at its clock's `node_now`, delivered to the collector: each copy's verdict."""
    outbox = agent.sock
    first = len(outbox.sent)
    agent.tick(seq, node_now)
    return [collector.handle(data) for data in outbox.sent[first:]]


def _run_clock_fix(
    tmp_path: Path, state_dir: Path | None, periods_after_fix: int = 24
) -> tuple[Collector, Clock, list, list[bytes]]:
    """node01's agent runs 6 periods on a right clock, restarts with its clock an hour behind, and NTP
    fixes the clock a minute later; returns the collector, its clock, (seconds after the fix, the
    new sample's verdict) per period after the fix, and every datagram sent while none was kept."""
    clock = Clock(T0)
    collector = _collector(clock)
    before = _agent(tmp_path, Clock(T0), state_dir)
    for seq in range(6):
        clock.now = T0 + 5 * seq
        assert _period(before, seq, clock.now, collector)[0] is None
    clock.now = T0 + 30
    behind = Clock(clock.now - HOUR)
    after = _agent(tmp_path, behind, state_dir)
    for seq in range(6):  # its samples carry a time an hour old: refused as stale, not yet replayed
        clock.now = T0 + 30 + 5 * seq
        assert _period(after, seq, clock.now - HOUR, collector)[0] == wire.STALE
    fixed_at = T0 + 60
    verdicts = []
    captured = list(before.sock.sent)
    for seq in range(6, 6 + periods_after_fix):
        clock.now = fixed_at + 5 * (seq - 6)
        if not any(verdict is None for _after, verdict in verdicts):
            captured = list(before.sock.sent) + list(after.sock.sent)  # all refused so far
        verdicts.append((clock.now - fixed_at, _period(after, seq, clock.now, collector)[0]))
    return collector, clock, verdicts, captured


def test_a_node_locked_out_after_its_clock_is_corrected_is_resynchronised_within_the_bound(
    tmp_path: Path, caplog
) -> None:
    """Regression: an agent restarted while its clock was behind got a lower boot epoch; after NTP
    fixed the clock it was refused as `replayed` for the collector's whole life, the node read
    UNKNOWN and no counter named it. Without a state folder the agent's epoch is the clock's: the
    collector's re-sync must bring the node back."""
    caplog.set_level(logging.WARNING, logger="stethoscope.telemetry.udp_collector")
    collector, _clock, verdicts, _captured = _run_clock_fix(tmp_path, state_dir=None)
    refused = [after for after, verdict in verdicts if verdict == wire.REPLAYED]
    kept = [after for after, verdict in verdicts if verdict is None]
    assert refused and max(refused) < wire.RESYNC_AFTER_MS / 1000  # refused no longer than the bound
    assert kept and min(kept) <= wire.RESYNC_AFTER_MS / 1000 + 5  # back within one period of it
    assert all(verdict is None for after, verdict in verdicts if after > min(kept))
    assert collector.guard.resyncs == {1: 1}
    named = collector.stats.node_rejected  # every refusal of the node's signed datagrams names it
    assert named[("node01", wire.REPLAYED)] == collector.stats.rejected[wire.REPLAYED] >= len(refused)
    assert named[("node01", wire.STALE)] == collector.stats.rejected[wire.STALE] >= 6
    assert any(
        "node01" in record.getMessage() and "re-synchronised" in record.getMessage()
        for record in caplog.records
    )
    rows = collector.health_rows(int(T0 * 1000)).rows()
    resync_rows = [r for r in rows if r["metric_name"] == "telemetry_stream_resyncs_total"]
    # device `collector`: the collector's count, which stops with a restart without reading as UNKNOWN
    assert [(r["node_id"], r["device"], r["value"]) for r in resync_rows] == [("node01", "collector", 1.0)]
    collector.stop()


def test_exact_replays_of_captured_datagrams_stay_refused_after_the_resync(tmp_path: Path) -> None:
    """Right after the re-sync, while the refused datagrams of the new epoch are still fresh."""
    periods = int(wire.RESYNC_AFTER_MS / 5000) + 1
    collector, clock, verdicts, captured = _run_clock_fix(tmp_path, state_dir=None, periods_after_fix=periods)
    assert collector.guard.resyncs == {1: 1} and verdicts[-1][1] is None
    received = collector.stats.received["node01"]
    for offset in (0.0, 5.0, 40.0):  # at once, a period later, past the resend horizon
        clock.now += offset
        assert [collector.handle(data) for data in captured].count(None) == 0
    assert collector.stats.received["node01"] == received
    collector.stop()


def test_an_agent_restarted_with_its_clock_behind_keeps_a_higher_boot_epoch(tmp_path: Path) -> None:
    """The agent's epoch is a counter in its state folder, not the clock: after the fix its samples
    are kept at once, no re-sync needed."""
    state = tmp_path / "state"
    first = _agent(tmp_path, Clock(T0), state)
    second = _agent(tmp_path, Clock(T0 + 30 - HOUR), state)
    assert second.boot_epoch == first.boot_epoch + 1
    assert (state / "boot_epoch").stat().st_mode & 0o777 == 0o600
    collector, _clock, verdicts, _captured = _run_clock_fix(tmp_path, state_dir=tmp_path / "state2")
    assert all(verdict is None for _after, verdict in verdicts)
    assert collector.guard.resyncs == {}
    collector.stop()


def test_an_agent_whose_state_folder_cannot_be_written_falls_back_to_the_clock(
    tmp_path: Path, capsys
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    agent = _agent(tmp_path, Clock(T0), blocker / "state")
    assert agent.boot_epoch == int(T0)
    assert "boot epoch" in capsys.readouterr().err


def _job_datagram(job: int, rank: int, now_ms: int, node: str = "node01", seq: int = 0) -> bytes:
    node_key = {name: key for key, name in NODES.items()}[node]
    return wire.encode(
        wire.node_secret(SECRET, node), set_id=SET_ID, node_key=node_key,
        part=wire.JOB_PART, boot_epoch=1, seq=seq, ts_ms=now_ms, values=[1.0] * 6, job=job, rank=rank,
        flags=wire.JOB_NUMERIC,
    )  # fmt: skip


def _job_streams(collector: Collector, node_key: int) -> int:
    return sum(1 for stream in collector.guard._state if stream[0] == node_key and stream[1] == wire.JOB_PART)


def test_a_node_sending_100000_job_rank_pairs_stays_within_the_cap_and_evictions_name_it() -> None:
    """Regression: distinct (job, rank) pairs in job-part datagrams of one node key grew serve from
    325 MB to 1.74 GB, never pruned."""
    clock = Clock(T0)
    collector = _collector(clock)
    now_ms = int(T0 * 1000)
    assert collector.handle(_job_datagram(7, 0, now_ms, node="node02")) is None
    pairs = 100_000
    for pair in range(pairs):
        job, rank = divmod(pair, 64)
        assert collector.handle(_job_datagram(job, rank, now_ms), now_ms=now_ms) is None
    cap = collector.guard.max_job_streams
    assert cap == wire.MAX_JOB_STREAMS == 4096
    assert _job_streams(collector, 1) == cap
    assert collector.guard.evicted == {1: pairs - cap}
    assert _job_streams(collector, 2) == 1  # another node's stream is not the flood's to evict
    assert len(collector._labels) <= collector.label_cache_entries
    rows = collector.health_rows(now_ms).rows()
    evicted = [r for r in rows if r["metric_name"] == "telemetry_job_streams_evicted_total"]
    assert [(r["node_id"], r["value"]) for r in evicted] == [("node01", float(pairs - cap))]
    collector.stop()


def test_job_streams_silent_past_the_freshness_window_are_pruned() -> None:
    clock = Clock(T0)
    collector = _collector(clock)
    finished = _job_datagram(1, 0, int(T0 * 1000))
    assert collector.handle(finished) is None
    clock.now = T0 + wire.FRESHNESS_MS / 1000 + 10
    assert collector.handle(_job_datagram(2, 0, int(clock.now * 1000))) is None
    assert _job_streams(collector, 1) == 1  # the finished job's state is gone, the live one's kept
    assert collector.handle(finished) == wire.STALE  # its replay is refused all the same
    collector.stop()


def test_refusals_of_signed_datagrams_name_the_node_and_forged_ones_create_no_series() -> None:
    clock = Clock(T0)
    collector = _collector(clock)
    now_ms = int(T0 * 1000)
    assert collector.handle(_job_datagram(1, 0, now_ms, seq=10)) is None
    assert collector.handle(_job_datagram(1, 0, now_ms, seq=20)) is None
    assert collector.handle(_job_datagram(1, 0, now_ms, seq=10)) == wire.REPLAYED
    assert collector.handle(_job_datagram(1, 0, now_ms - 2 * wire.FRESHNESS_MS, seq=30)) == wire.STALE
    forged = bytearray(_job_datagram(1, 0, now_ms, node="node02", seq=40))
    forged[-1] ^= 1
    assert collector.handle(bytes(forged)) == wire.MAC
    assert dict(collector.stats.node_rejected) == {("node01", wire.REPLAYED): 1, ("node01", wire.STALE): 1}
    rows = collector.health_rows(now_ms).rows()
    named = {
        (r["node_id"], r["labels"]["reason"]): r["value"]
        for r in rows
        if r["metric_name"] == "telemetry_node_packets_rejected_total"
    }
    assert named == {("node01", "replayed"): 1.0, ("node01", "stale"): 1.0}
    assert not [r for r in rows if r["node_id"] == "node02"]

    class Families:
        def collect(self):
            return node_refusal_families(collector)

    registry = CollectorRegistry()
    registry.register(Families())
    text = generate_latest(registry).decode()
    assert 'stethoscope_telemetry_node_packets_rejected_total{node="node01",reason="replayed"} 1.0' in text
    assert 'node="node02"' not in text
    collector.stop()


def _header(seq: int, epoch: int, ts_ms: int, part: int = 0) -> wire.Header:
    return wire.Header(wire.VERSION, part, 1, 7, epoch, seq, ts_ms, 0, 0, 0, 0)


def test_a_stream_another_sender_still_feeds_is_never_resynchronised() -> None:
    """Two senders of one stream (a second agent left running): the lower epoch's fresh, signed
    datagrams stay refused as long as the higher one's are kept, however long that lasts."""
    guard = wire.SequenceGuard()
    now = int(T0 * 1000)
    guard.accept(_header(0, 200, now))
    for step in range(1, 40):
        now += 5000
        guard.accept(_header(step, 200, now))
        old = _header(step, 100, now)
        assert guard.check(old) == wire.REPLAYED
        assert not guard.refused(old, now)
    assert guard.resyncs == {}


def test_a_higher_boot_epoch_older_than_the_newest_kept_sample_is_a_replay() -> None:
    """After a re-sync to a lower epoch, the retired higher epoch's datagrams must not win back."""
    guard = wire.SequenceGuard()
    now = int(T0 * 1000)
    guard.accept(_header(5, 100, now))
    assert guard.check(_header(6, 200, now - 1)) == wire.REPLAYED
    assert guard.check(_header(0, 200, now)) is None  # a restart: a new epoch, no older than what was kept


def test_a_restored_window_keeps_the_job_stream_cap() -> None:
    guard = wire.SequenceGuard(max_job_streams=3)
    entries = [((7, wire.JOB_PART, job, 0), 1, 0, 0, [0], int(T0 * 1000) + job) for job in range(5)]
    guard.restore(entries)
    assert sorted(stream[2] for stream in guard._state) == [2, 3, 4]  # the newest three
    assert guard.evicted == {7: 2}
