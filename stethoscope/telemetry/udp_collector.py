"""The stream's collector (docs/design.md "Telemetry"): receive and decode in one thread, write in another.

The receiving thread checks each datagram (shape, version, set, node key, MAC, freshness, sequence),
keeps each (node, part, boot epoch, seq) once and turns it into metric rows labelled
`source=stream`; the writing thread hands what arrived to the store's Writer once a second (which
spools when the store cannot take it). What neither the store nor the spool takes (a full or read-only
disk) is held in memory, bounded (store.hold), counted as at risk and handed to the next write; no
error ends the writing thread, and `write_health()` says degraded, with the reason, until the rows
are written. Rejections are counted by reason, never per claimed node, so
a forged key creates no series; those refused after the MAC verified (stale, replayed) are counted
per node too. A stream refused as replayed for a bounded time while it sends fresh, signed datagrams
is re-synchronised to them (its clock or boot counter moved back), counted and logged naming the
node; the guard's (job, rank) streams are capped per node key, the evictions counted. A value that
is not a finite number is dropped alone and counted (`telemetry_values_rejected_total`); the
collector's own counters are stored as pipeline-health metrics. With a state folder, the replay
window survives a restart (telemetry.replay_state).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.dsn import ConfigError, redact
from stethoscope.store.hold import Hold, held_rows
from stethoscope.store.writer import WriteReport
from stethoscope.telemetry import wire
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import MetricSet
from stethoscope.telemetry.replay_state import ReplayState

log = logging.getLogger(__name__)
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33 if sys.platform.startswith("linux") else None)
DEFAULT_RCVBUF = 64 << 20
DUPLICATE = "duplicate"
# A batch the embedded store is slow to take is better waited for than spooled: spooling and then
# replaying it costs more than the insert, and a write that times out may land anyway (twice).
WRITE_TIMEOUT = 30.0
SELF = "collector"  # the device of the collector's own health rows (stored under its host's name)
NONFINITE = "nonfinite"  # the reason a value is dropped alone: ±Inf (NaN is a missing reading)
VALUE_REASONS = (NONFINITE,)
INTERNAL = "internal"  # the reason a datagram is dropped when handling it raised
PACKET_REASONS = (*wire.REASONS, INTERNAL)
# why a write failed: the store refused (rows spooled), the spool refused (rows held in memory), the
# sink raised, or the flush around it did
WRITE_ERROR_KINDS = ("store", "spool", "sink", "flush")
PRUNE_EVERY_MS = 5_000  # how often the guard's job streams silent past the freshness window go
RESYNC_LOG_EVERY_MS = 60_000  # at most one re-sync line per node this often (a node has many streams)
# A part's names and labels made once per (set, part kind, job, rank): about 1.6 KB each, so at most
# ~26 MiB; a (job, rank) beyond it has its labels made again when it comes back.
LABEL_CACHE_ENTRIES = 16_384


def job_streams_per_node(default: int = wire.MAX_JOB_STREAMS) -> int:
    """How many (job, rank) streams the replay guard holds per node key: STETHOSCOPE_JOB_STREAMS_PER_NODE
    where it is set, else `default`."""
    raw = os.environ.get("STETHOSCOPE_JOB_STREAMS_PER_NODE", "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"STETHOSCOPE_JOB_STREAMS_PER_NODE={raw!r} must be a number of streams, 1 or more")
    return int(raw)


@dataclass(frozen=True)
class NodeRefusals:
    """What the collector refused of nodes whose MAC it verified, by node_id: claimed nodes are never
    named, so a forged key creates no series."""

    rejected: dict[tuple[str, str], int]  # (node, reason) -> signed datagrams refused (stale, replayed)
    resyncs: dict[str, int]  # node -> streams re-synchronised after its epoch or sequence moved back
    evicted: dict[str, int]  # node -> job streams dropped for the per-node cap


@dataclass
class Stats:
    datagrams: int = 0
    duplicates: int = 0
    rejected: Counter = field(default_factory=Counter)  # reason -> datagrams
    # (node_id, reason) -> datagrams refused after their MAC verified (wire.AUTHENTICATED_REASONS)
    node_rejected: Counter = field(default_factory=Counter)
    values_rejected: Counter = field(default_factory=Counter)  # reason -> values of kept datagrams
    received: Counter = field(default_factory=Counter)  # node_id -> samples kept
    rows: int = 0
    stored: int = 0
    spooled: int = 0
    write_errors: int = 0
    last_error: str | None = None


@dataclass(frozen=True)
class WriteHealth:
    """The writing side at a glance: "degraded" while the last write did not reach the store or rows
    wait in memory (at risk: a crash loses them), with the reason."""

    state: str  # "ok" or "degraded"
    reason: str | None
    rows_at_risk: int
    rows_lost: int  # dropped beyond the hold's bound, or held still when the collector stopped
    errors: dict[str, int]  # failed writes by kind: store, spool, sink, flush


class Collector:
    def __init__(
        self,
        keyring: Keyring,
        sets: dict[int, MetricSet],
        sink: Callable[[Batch], WriteReport],
        listen: tuple[str, int] = ("127.0.0.1", 0),
        flush_interval: float = 1.0,
        health_interval: float = 5.0,
        rcvbuf: int = DEFAULT_RCVBUF,
        collector_id: str | None = None,
        clock: Callable[[], float] = time.time,
        state_dir: Path | None = None,
        hold_rows: int | None = None,
        job_streams: int | None = None,
    ):
        self.keyring = keyring
        self.sets = sets
        self.sink = sink
        self.flush_interval = flush_interval
        self.health_interval = health_interval
        self.collector_id = collector_id or socket.gethostname()
        self.clock = clock
        # job_streams: (job, rank) streams the guard holds per node key (STETHOSCOPE_JOB_STREAMS_PER_NODE)
        self.guard = wire.SequenceGuard(max_job_streams=job_streams or job_streams_per_node())
        self.stats = Stats()
        self._pending = MetricColumns()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self.hold = Hold(hold_rows)  # STETHOSCOPE_HOLD_ROWS when not given
        # every kind from the start: a reader (serve's HTTP thread) never sees the dict grow
        self.write_errors: Counter[str] = Counter(dict.fromkeys(WRITE_ERROR_KINDS, 0))
        self._write_problem: str | None = None
        self._at_risk = 0  # the hold's rows after the last flush (it is empty while a write runs)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._labels: dict[tuple, tuple[list[str], list[dict[str, str]]]] = {}
        self.label_cache_entries = LABEL_CACHE_ENTRIES
        self._pruned_at_ms = 0
        self._resync_logged_at: dict[str, int] = {}  # node -> when its last re-sync was logged (ms)
        self._last_health = 0.0
        self.sock = socket.socket(socket.AF_INET6 if ":" in listen[0] else socket.AF_INET, socket.SOCK_DGRAM)
        self.rcvbuf = _grow_rcvbuf(self.sock, rcvbuf)
        try:
            self.sock.bind(listen)
        except OSError as exc:
            self.sock.close()
            raise ConfigError(
                f"--listen {listen[0]}:{listen[1]}: cannot listen there: {exc.strerror}"
            ) from None
        self.sock.settimeout(0.2)
        self.replay_state = ReplayState.under(state_dir, self.address[1]) if state_dir else None
        if self.replay_state is not None:
            self.replay_state.load(self.guard, keyring.nodes, int(clock() * 1000))

    @property
    def address(self) -> tuple[str, int]:
        return self.sock.getsockname()[:2]

    # threads ----------------------------------------------------------------------------------
    def start(self) -> Collector:
        self._last_health = self.clock()
        for target, name in ((self._receive_loop, "receive"), (self._write_loop, "write")):
            thread = threading.Thread(target=target, name=f"stethoscope-collector-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> WriteReport | None:
        """Stop receiving, take what the socket still holds, and write it all (nothing lost)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        try:
            self._drain()
            return self.flush(health=True)
        finally:  # what is still held is counted lost, and the port freed, whatever the last flush did
            self._give_up_held()
            self.sock.close()

    def _receive_loop(self) -> None:
        sock = self.sock
        while not self._stop.is_set():
            try:
                data = sock.recv(2048)
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            try:
                self.handle(data)
            except Exception:  # one datagram's fault costs that datagram: the thread never dies
                log.exception("collector: a datagram could not be handled; it is dropped and counted")
                self.stats.rejected[INTERNAL] += 1

    def _drain(self) -> None:
        self.sock.setblocking(False)
        while True:
            try:
                self.handle(self.sock.recv(2048))
            except OSError:
                return

    def _write_loop(self) -> None:
        """A flush every flush_interval from when the last one began: one that took longer (a slow
        store) is followed at once, its rows waiting meanwhile written without a further idle interval."""
        began = self.clock()
        while not self._stop.wait(self._until_next_flush(began)):
            began = self.clock()
            try:
                self.flush()
            except Exception as exc:  # the thread outlives any error: what it took is held, the next try
                self.write_errors["flush"] += 1
                self._say(f"flush failed: {type(exc).__name__}: {redact(exc)}")

    def _until_next_flush(self, began: float) -> float:
        """Seconds to wait before the next flush: never past the interval, whatever the clock did."""
        return min(self.flush_interval, max(0.0, began + self.flush_interval - self.clock()))

    # receiving --------------------------------------------------------------------------------
    def handle(self, data: bytes, now_ms: int | None = None) -> str | None:
        """Take one datagram; return why it was not kept (a rejection reason or "duplicate")."""
        self.stats.datagrams += 1
        header = wire.parse_header(data)
        if isinstance(header, wire.Rejection):
            return self._reject(header.reason)
        # A copy already kept is dropped before its MAC is checked: it changes nothing either way.
        verdict = self.guard.check(header)
        if verdict == DUPLICATE:
            self.stats.duplicates += 1
            return DUPLICATE
        now = int(self.clock() * 1000) if now_ms is None else now_ms
        sample = wire.authenticate(data, header, self.keyring.keys_of, now, self.sets.__contains__)
        if isinstance(sample, wire.Rejection):
            return self._reject(sample.reason, header)
        with self._lock:  # the writing thread reads the guard's and the stats' counts
            self._prune_silent_jobs(now)
            if verdict is None:
                self.guard.accept(header)
            elif not self._resynced(header, now):
                return self._reject(verdict, header)
            if sample.nonfinite:
                self.stats.values_rejected[NONFINITE] += sample.nonfinite
            self._rows(sample)
        return None

    def _reject(self, reason: str, header: wire.Header | None = None) -> str:
        """Count a refusal by reason and, once the datagram's MAC verified, by its node too."""
        self.stats.rejected[reason] += 1
        if header is not None and reason in wire.AUTHENTICATED_REASONS:
            self.stats.node_rejected[(self.keyring.node_of(header.node_key), reason)] += 1
        return reason

    def _resynced(self, header: wire.Header, now_ms: int) -> bool:
        """Whether this signed, fresh datagram, refused as replayed, re-synchronised its stream: the
        guard's bound passed with nothing of the stream kept (its epoch or sequence moved back)."""
        if not self.guard.refused(header, now_ms):
            return False
        self.guard.resync(header)
        node = self.keyring.node_of(header.node_key)
        last = self._resync_logged_at.get(node)
        if last is None or not 0 <= now_ms - last < RESYNC_LOG_EVERY_MS:
            self._resync_logged_at[node] = now_ms
            log.warning(
                "collector: %s: part %d (job %d, rank %d) re-synchronised to boot epoch %d, sequence %d: "
                "its signed, fresh datagrams were refused as replayed for %d s (its clock or boot counter "
                "moved back); %d re-syncs of %s so far",
                node, header.part, header.job, header.rank, header.boot_epoch, header.seq,
                self.guard.resync_after_ms // 1000, self.guard.resyncs[header.node_key], node,
            )  # fmt: skip
        return True

    def _prune_silent_jobs(self, now_ms: int) -> None:
        """Every few seconds, drop the guard's job streams silent past the freshness window."""
        if 0 <= now_ms - self._pruned_at_ms < PRUNE_EVERY_MS:
            return
        self._pruned_at_ms = now_ms
        self.guard.prune(now_ms - wire.FRESHNESS_MS)

    def node_refusals(self) -> NodeRefusals:
        """Per node, what was refused of its signed datagrams: a snapshot, taken under the lock."""
        with self._lock:
            return NodeRefusals(
                rejected=dict(self.stats.node_rejected),
                resyncs={self.keyring.node_of(key): n for key, n in self.guard.resyncs.items()},
                evicted={self.keyring.node_of(key): n for key, n in self.guard.evicted.items()},
            )

    def _rows(self, sample: wire.Sample) -> None:
        header = sample.header
        node = self.keyring.node_of(header.node_key)
        metric_set = self.sets[header.set_id]
        names, labels = self._slots_of(metric_set, header)
        if header.part == wire.NODE_PART:
            device = "node"
        elif header.part == wire.JOB_PART:
            device = "job"
        else:
            device = f"gpu{header.part - 1}"
        self.stats.received[node] += 1
        values = sample.values[: len(names)]
        if not all(map(math.isfinite, values)):  # NaN is a missing reading, never a zero
            kept = [i for i, value in enumerate(values) if math.isfinite(value)]
            names = [names[i] for i in kept]
            labels = [labels[i] for i in kept]
            values = tuple(values[i] for i in kept)
        n = len(values)
        pending = self._pending  # column by column: a sample's rows in one extend per column
        pending.node_id.extend([node] * n)
        pending.metric_name.extend(names[:n])
        pending.device.extend([device] * n)
        pending.labels.extend(labels[:n])
        pending.value.extend(values)
        pending.timestamp.extend([header.ts_ms] * n)
        self.stats.rows += n

    def _slots_of(self, metric_set: MetricSet, header: wire.Header) -> tuple[list[str], list[dict[str, str]]]:
        """A part's metric names and each row's labels, made once per (set, part kind, job)."""
        job = header.part == wire.JOB_PART
        cache_key: tuple[int, ...] = (
            metric_set.id,
            header.part if header.part in (wire.NODE_PART, wire.JOB_PART) else 1,
        )
        cache_key += (header.job, header.rank, header.flags) if job else ()
        cached = self._labels.get(cache_key)
        if cached is None:
            base = {"source": "stream"}
            if job:
                base.update(job=wire.job_label(header.job, header.flags), rank=str(header.rank))
            labels = [
                {**base, "agg": slot.agg} if slot.agg else dict(base)
                for slot in metric_set.slots(header.part)
            ]
            if len(self._labels) >= self.label_cache_entries:
                del self._labels[next(iter(self._labels))]  # the oldest made
            cached = self._labels[cache_key] = (metric_set.names(header.part), labels)
        return cached

    # writing ----------------------------------------------------------------------------------
    def flush(self, health: bool = False) -> WriteReport | None:
        """Hand what is held from failed writes and what arrived since to the sink; what it could
        neither store nor spool is held again for the next flush."""
        with self._write_lock:
            now = self.clock()
            window = None
            with self._lock:
                metrics, self._pending = self._pending, MetricColumns()
                if self.replay_state is not None and (health or self.replay_state.due()):
                    # the window of exactly the samples handed to the sink below
                    window = self.replay_state.snapshot(self.guard, self.keyring.nodes, int(now * 1000))
            self._hold(Batch(metrics=metrics))  # held at once: nothing taken is lost if what follows fails
            if health or now - self._last_health >= self.health_interval:
                self._last_health = now
                self._hold(Batch(metrics=self.health_rows(int(now * 1000))))
            batch = self.hold.take()
            if not held_rows(batch):
                self._save(window)
                return None
            report, sink_raised = self._write(batch)
            self._hold(report.held)
            self._at_risk = self.hold.rows
            if not held_rows(report.held):  # a window past rows only in memory would refuse their resends
                self._save(window)
            self._account(report, sink_raised)
            return report

    def _write(self, batch: Batch) -> tuple[WriteReport, bool]:
        """The sink's report, and whether it raised: then the whole batch is held."""
        try:
            return self.sink(batch), False
        except Exception as exc:  # whatever the sink raises, the rows wait for the next flush
            return WriteReport(error=f"{type(exc).__name__}: {redact(exc)}", held=batch), True

    def _hold(self, batch: Batch) -> None:
        dropped = self.hold.keep(batch)
        if dropped:
            log.error(
                "collector: %d rows dropped, neither stored nor spooled: %d are held in memory already "
                "(STETHOSCOPE_HOLD_ROWS); %d lost since the start",
                dropped,
                self.hold.limit,
                self.hold.lost,
            )

    def _account(self, report: WriteReport, sink_raised: bool) -> None:
        self.stats.stored += report.stored
        self.stats.spooled += report.spooled
        if report.error:
            self.stats.write_errors += 1
            self.stats.last_error = report.error
        if sink_raised:
            self.write_errors["sink"] += 1
            self._say(f"sink failed: {report.error}")
            return
        self.write_errors.update(
            kind for kind, failed in (("store", report.error), ("spool", report.spool_error)) if failed
        )
        if report.spool_error:
            self._say(report.spool_error + (f" (store: {report.error})" if report.error else ""))
        elif report.error:
            self._say(f"store: {report.error}; rows spooled")
        else:
            self._say(None)

    def _say(self, problem: str | None) -> None:
        """Log a change of the writing side's state once, not every flush."""
        if problem == self._write_problem:
            return
        if problem is not None:
            log.warning("collector: %s; %d rows held in memory", problem, self._at_risk)
        else:
            log.warning("collector: writes recovered: everything held is stored or spooled")
        self._write_problem = problem

    def _give_up_held(self) -> None:
        """Rows still held when the collector stops go with the process: counted and said."""
        left = held_rows(self.hold.take())
        self._at_risk = 0
        if left:
            self.hold.lost += left
            log.error(
                "collector: stopped with %d rows neither stored nor spooled: lost (%s)",
                left,
                self._write_problem,
            )

    def write_health(self) -> WriteHealth:
        degraded = self._write_problem is not None or self._at_risk > 0
        return WriteHealth(
            state="degraded" if degraded else "ok",
            reason=self._write_problem,
            rows_at_risk=self._at_risk,
            rows_lost=self.hold.lost,
            errors=dict(self.write_errors),
        )

    def _save(self, window: list[dict] | None) -> None:
        """After the sink took the samples (stored or spooled): a window saved before would refuse
        the resends of samples that were never written."""
        if window is not None and self.replay_state is not None:
            self.replay_state.save(window)

    def health_rows(self, ts_ms: int) -> MetricColumns:
        rows = MetricColumns()
        with self._lock:
            received = dict(self.stats.received)
            lost = {self.keyring.node_of(key): n for key, n in self.guard.lost.items()}
        # a node sending to two collectors has one series per collector: each counts what it received
        mine = {"collector": self.collector_id}
        for node in sorted(set(received) | set(lost)):
            rows.append(
                node, "telemetry_packets_received_total", "node", mine, float(received.get(node, 0)), ts_ms
            )
            rows.append(node, "telemetry_packets_lost_total", "node", mine, float(lost.get(node, 0)), ts_ms)
        for reason in wire.REASONS:
            rows.append(
                self.collector_id,
                "telemetry_packets_rejected_total",
                SELF,
                {"reason": reason},
                float(self.stats.rejected[reason]),
                ts_ms,
            )
        for reason in VALUE_REASONS:
            rows.append(
                self.collector_id,
                "telemetry_values_rejected_total",
                SELF,
                {"reason": reason},
                float(self.stats.values_rejected[reason]),
                ts_ms,
            )
        rows.extend(self._node_refusal_rows(ts_ms))
        return rows

    def _node_refusal_rows(self, ts_ms: int) -> MetricColumns:
        """Per node for nodes with any (device `collector`: no UNKNOWN when a restart ends them): its
        signed datagrams refused, by reason; its streams re-synchronised; its job streams evicted."""
        refusals = self.node_refusals()
        rows = MetricColumns()
        for (node, reason), count in sorted(refusals.rejected.items()):
            rows.append(
                node,
                "telemetry_node_packets_rejected_total",
                SELF,
                {"reason": reason},
                float(count),
                ts_ms,
            )
        for name, counts in (
            ("telemetry_stream_resyncs_total", refusals.resyncs),
            ("telemetry_job_streams_evicted_total", refusals.evicted),
        ):
            for node, count in sorted(counts.items()):
                rows.append(node, name, SELF, {}, float(count), ts_ms)
        return rows


def _grow_rcvbuf(sock: socket.socket, size: int) -> int:
    """Ask for a large receive buffer (bursts of 2,000 nodes arrive within milliseconds); the kernel
    caps SO_RCVBUF at net.core.rmem_max unless the process may force it."""
    for option in (SO_RCVBUFFORCE, socket.SO_RCVBUF):
        if option is None:
            continue
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, size)
            break
        except OSError:
            continue
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
