"""The stream's collector (docs/design.md "Telemetry"): receive and decode in one thread, write in another.

The receiving thread checks each datagram (shape, version, set, node key, MAC, freshness, sequence),
keeps each (node, part, boot epoch, seq) once and turns it into metric rows labelled
`source=stream`; the writing thread hands what arrived to the store's Writer once a second (which
spools when the store cannot take it). Rejections are counted by reason, never per claimed node, so
a forged key creates no series; a value that is not a finite number is dropped alone and counted
(`telemetry_values_rejected_total`); the collector's own counters are stored as pipeline-health
metrics. With a state folder, the replay window survives a restart (telemetry.replay_state).
"""

from __future__ import annotations

import logging
import math
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.dsn import ConfigError
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
NONFINITE = "nonfinite"  # the reason a value is dropped alone: ±Inf (NaN is a missing reading)
VALUE_REASONS = (NONFINITE,)


@dataclass
class Stats:
    datagrams: int = 0
    duplicates: int = 0
    rejected: Counter = field(default_factory=Counter)  # reason -> datagrams
    values_rejected: Counter = field(default_factory=Counter)  # reason -> values of kept datagrams
    received: Counter = field(default_factory=Counter)  # node_id -> samples kept
    rows: int = 0
    stored: int = 0
    spooled: int = 0
    write_errors: int = 0
    last_error: str | None = None


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
    ):
        self.keyring = keyring
        self.sets = sets
        self.sink = sink
        self.flush_interval = flush_interval
        self.health_interval = health_interval
        self.collector_id = collector_id or socket.gethostname()
        self.clock = clock
        self.guard = wire.SequenceGuard()
        self.stats = Stats()
        self._pending = MetricColumns()
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._labels: dict[tuple, tuple[list[str], list[dict[str, str]]]] = {}
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
        self._drain()
        report = self.flush(health=True)
        self.sock.close()
        return report

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
            self.handle(data)

    def _drain(self) -> None:
        self.sock.setblocking(False)
        while True:
            try:
                self.handle(self.sock.recv(2048))
            except OSError:
                return

    def _write_loop(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self.flush()

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
            return self._reject(sample.reason)
        if verdict is not None:
            return self._reject(verdict)
        with self._lock:  # the writing thread reads the guard's and the stats' counts
            self.guard.accept(header)
            if sample.nonfinite:
                self.stats.values_rejected[NONFINITE] += sample.nonfinite
            self._rows(sample)
        return None

    def _reject(self, reason: str) -> str:
        self.stats.rejected[reason] += 1
        return reason

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
            cached = self._labels[cache_key] = (metric_set.names(header.part), labels)
        return cached

    # writing ----------------------------------------------------------------------------------
    def flush(self, health: bool = False) -> WriteReport | None:
        with self._write_lock:
            now = self.clock()
            window = None
            with self._lock:
                metrics, self._pending = self._pending, MetricColumns()
                if self.replay_state is not None and (health or self.replay_state.due()):
                    # the window of exactly the samples handed to the sink below
                    window = self.replay_state.snapshot(self.guard, self.keyring.nodes, int(now * 1000))
            if health or now - self._last_health >= self.health_interval:
                self._last_health = now
                metrics.extend(self.health_rows(int(now * 1000)))
            if not len(metrics):
                self._save(window)
                return None
            report = self.sink(Batch(metrics=metrics))
            self._save(window)
            self.stats.stored += report.stored
            self.stats.spooled += report.spooled
            if report.error:
                self.stats.write_errors += 1
                if report.error != self.stats.last_error:
                    log.warning("collector: store: %s; %d rows spooled", report.error, report.spooled)
                self.stats.last_error = report.error
            return report

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
        for node in sorted(set(received) | set(lost)):
            rows.append(
                node, "telemetry_packets_received_total", "node", {}, float(received.get(node, 0)), ts_ms
            )
            rows.append(node, "telemetry_packets_lost_total", "node", {}, float(lost.get(node, 0)), ts_ms)
        for reason in wire.REASONS:
            rows.append(
                self.collector_id,
                "telemetry_packets_rejected_total",
                "collector",
                {"reason": reason},
                float(self.stats.rejected[reason]),
                ts_ms,
            )
        for reason in VALUE_REASONS:
            rows.append(
                self.collector_id,
                "telemetry_values_rejected_total",
                "collector",
                {"reason": reason},
                float(self.stats.values_rejected[reason]),
                ts_ms,
            )
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
