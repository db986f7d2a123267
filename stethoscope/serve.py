"""`stethoscope serve`: the long-running process (docs/design.md "Telemetry"): the stream's collector, the
diagnosis cycle every interval (acting only with --execute) and an HTTP endpoint on loopback.

With the embedded default, serve is the database's only owner while it runs: it holds one handle
open from start to stop (another process's open is refused, so the callback, `ingest` and playbook
runs spool) and the collector's writer replays the spool with each batch. chdb runs queries from
several threads of one process at once (benchmarks/chdb_threads.py), so the cycle reads through
that handle while the collector's writing thread inserts through its own.

SIGTERM and SIGINT stop it gracefully: the collector stops receiving, takes what the socket still
holds, and writes (or spools) everything before the handle closes.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.diagnose import LEVEL_ACTIONS, action_label, diagnose
from stethoscope.diagnosis.model import ModelUse
from stethoscope.diagnosis.rules import Condition, Group, Rule
from stethoscope.diagnosis.unknown import Fleet
from stethoscope.report import board
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.store.writer import Writer
from stethoscope.telemetry.collector import WRITE_TIMEOUT, Collector
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import MetricSet

log = logging.getLogger(__name__)
STREAM_LEVEL_CAP = "L3"


@dataclass
class CycleState:
    cycles: int = 0
    failures: int = 0
    last_at: float | None = None
    last_error: str | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None  # the board's index.html, written by the last cycle


def stream_only_metrics(sets: dict[int, MetricSet], catalog: Catalog) -> set[str]:
    """Names only the stream reports: in a metric set and declared at the stream's cadence."""
    names = {slot.metric for s in sets.values() for slots in s.parts.values() for slot in slots}
    return {name for name in names if (spec := catalog.get(name)) is not None and spec.interval <= 5}


def _conditions(group: Group) -> list[Condition]:
    found: list[Condition] = []
    for item in group.items:
        found.extend(_conditions(item) if isinstance(item, Group) else [item])
    return found


def is_stream_only(rule: Rule, stream_names: set[str]) -> bool:
    conditions = _conditions(rule.when)
    return bool(conditions) and all(
        c.metric in stream_names or ("source", "stream") in c.labels for c in conditions
    )


def cap_stream_only(findings: list[dict[str, Any]], rules: list[Rule], stream_names: set[str]) -> None:
    """A finding whose evidence comes from the stream alone (a stream rule's, the model's) is capped at
    L3: no drain."""
    stream_rules = {r.rule_id for r in rules if is_stream_only(r, stream_names)}
    for finding in findings:
        from_stream = finding["rule_id"] in stream_rules or finding["rule_id"].startswith("model.")
        if not from_stream or finding["level"] != "L4":
            continue
        finding["level"] = STREAM_LEVEL_CAP
        plan = [a for a in finding["plan"] if "drain" not in str(dict(a.params).get("playbook", ""))]
        finding["plan"] = plan or list(LEVEL_ACTIONS[STREAM_LEVEL_CAP])
        finding["actions"] = [action_label(a) for a in finding["plan"]]


class Server:
    def __init__(
        self,
        *,
        dsn: str | None,
        database: str | None,
        spool_dir: Path,
        keyring: Keyring,
        sets: dict[int, MetricSet],
        listen: tuple[str, int],
        http: tuple[str, int] | None,
        interval: float,
        rules: Callable[[], list[Rule]],
        catalog: Catalog,
        execute_with: Any = None,
        flush_interval: float = 1.0,
        model: ModelUse | None = None,
        fleet: Fleet | None = None,
    ):
        self.store = Store(dsn, database)
        self.spool_dir = spool_dir
        self.report_dir = spool_dir.parent / "report"  # beside the spool: .stethoscope/report
        self.keyring, self.sets, self.listen, self.http_address = keyring, sets, listen, http
        self.interval, self.rules, self.catalog = interval, rules, catalog
        self.execute_with = execute_with
        self.model = model
        self.fleet = fleet  # the inventory's hosts and cadences UNKNOWN answers for
        self.flush_interval = flush_interval
        self.state = CycleState()
        self.stop_event = threading.Event()
        self.stream_names = stream_only_metrics(sets, catalog)
        self.collector: Collector | None = None
        self.httpd: ThreadingHTTPServer | None = None
        self.started = time.time()

    # life -------------------------------------------------------------------------------------
    def start(self) -> Server:
        self.store.open()  # held until stop: the embedded database's only owner
        self.store.ensure_schema()
        writer = Writer(self.store.dsn, self.spool_dir, timeout=WRITE_TIMEOUT)
        self.collector = Collector(
            self.keyring, self.sets, writer.write, listen=self.listen, flush_interval=self.flush_interval
        ).start()
        if self.http_address is not None:
            self.httpd = ThreadingHTTPServer(self.http_address, _handler(self))
            self.httpd.daemon_threads = True
            threading.Thread(target=self.httpd.serve_forever, name="stethoscope-http", daemon=True).start()
        return self

    def run(self, cycles: int = 0) -> None:
        """Diagnose every interval until stopped (or `cycles` have run)."""
        while not self.stop_event.is_set():
            self.cycle()
            if cycles and self.state.cycles + self.state.failures >= cycles:
                break
            self.stop_event.wait(self.interval)

    def stop(self) -> None:
        self.stop_event.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
        if self.collector is not None:
            self.collector.stop()  # drains the socket, writes or spools everything
        self.store.close()

    # the cycle --------------------------------------------------------------------------------
    def cycle(self) -> None:
        at_ms = int(time.time() * 1000)
        rules = self.rules()
        try:
            findings = diagnose(self.store, rules, at_ms, self.catalog, fleet=self.fleet, model=self.model)
            cap_stream_only(findings, rules, self.stream_names)
            if self.execute_with is not None:
                from stethoscope.remediation.executor import Executor

                context = self.execute_with(self.store.dsn, self.store.database)
                seen = self.model.evaluated if self.model is not None and self.model.ran else None
                findings = Executor(context).run(findings, rules, at_ms, model_nodes=seen)
            today = board.collect(self.store, self.catalog, 7, at_ms, rules, today=findings)
            written = board.write(today, self.report_dir)
        except Exception as exc:  # the store may come back, a rule be fixed: the next cycle tries again
            self.state.failures += 1
            self.state.last_error = f"{type(exc).__name__}: {redact(str(exc))}"
            log.warning("serve: cycle: %s", self.state.last_error)
            return
        self.state.cycles += 1
        self.state.last_at = time.time()
        self.state.last_error = None
        self.state.findings = findings
        self.state.report = written

    # HTTP -------------------------------------------------------------------------------------
    def page(self, name: str) -> bytes | None:
        """The last board's index.html or one of its node pages (`name` matched by NODE_PAGE)."""
        if self.state.report is None:
            return None
        path = self.report_dir / name
        return path.read_bytes() if path.is_file() else None

    def health(self) -> tuple[int, dict[str, Any]]:
        fresh = self.state.last_at is not None and time.time() - self.state.last_at <= 3 * self.interval + 30
        starting = self.state.last_at is None and time.time() - self.started <= 3 * self.interval + 30
        ok = (fresh or starting) and self.state.last_error is None
        stats = self.collector.stats if self.collector else None
        body = {
            "status": "ok" if ok else "failing",
            "cycles": self.state.cycles,
            "cycle_failures": self.state.failures,
            "last_cycle": self.state.last_at,
            "last_error": self.state.last_error,
            "collector": {
                "datagrams": stats.datagrams if stats else 0,
                "stored_rows": stats.stored if stats else 0,
                "spooled_rows": stats.spooled if stats else 0,
                "last_write_error": stats.last_error if stats else None,
            },
        }
        return (200 if ok else 503), body

    def metrics(self) -> bytes:
        registry = CollectorRegistry()
        registry.register(_Exposition(self))
        return generate_latest(registry)


class _Exposition:
    """Open findings by severity and rule, and the collector's counters, in Prometheus' text format."""

    def __init__(self, server: Server):
        self.server = server

    def collect(self):
        findings = GaugeMetricFamily(
            "stethoscope_findings_open", "open findings at the last cycle", labels=["severity", "rule_id"]
        )
        counts: dict[tuple[str, str], int] = {}
        for finding in self.server.state.findings:
            key = (finding["severity"], finding["rule_id"])
            counts[key] = counts.get(key, 0) + 1
        for (severity, rule_id), count in sorted(counts.items()):
            findings.add_metric([severity, rule_id], count)
        yield findings
        cycles = CounterMetricFamily("stethoscope_cycles", "diagnosis cycles", labels=["outcome"])
        cycles.add_metric(["ok"], self.server.state.cycles)
        cycles.add_metric(["failed"], self.server.state.failures)
        yield cycles
        collector = self.server.collector
        if collector is None:
            return
        stats = collector.stats
        datagrams = CounterMetricFamily("stethoscope_telemetry_datagrams", "datagrams received")
        datagrams.add_metric([], stats.datagrams)
        yield datagrams
        duplicates = CounterMetricFamily("stethoscope_telemetry_duplicates", "resent copies already kept")
        duplicates.add_metric([], stats.duplicates)
        yield duplicates
        rejected = CounterMetricFamily(
            "stethoscope_telemetry_packets_rejected", "datagrams dropped", labels=["reason"]
        )
        for reason, count in sorted(stats.rejected.items()):
            rejected.add_metric([reason], count)
        yield rejected
        lost = CounterMetricFamily("stethoscope_telemetry_packets_lost", "samples no resend recovered")
        lost.add_metric([], sum(collector.guard.lost.values()))
        yield lost
        rows = CounterMetricFamily(
            "stethoscope_telemetry_rows", "rows handed to the store", labels=["outcome"]
        )
        rows.add_metric(["stored"], stats.stored)
        rows.add_metric(["spooled"], stats.spooled)
        yield rows


NODE_PAGE = re.compile(r"/report/nodes/[A-Za-z0-9._-]+\.html")


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                status, body = server.health()
                self._send(status, "application/json", json.dumps(body).encode())
            elif path == "/metrics":
                self._send(200, "text/plain; version=0.0.4; charset=utf-8", server.metrics())
            elif path in ("/report", "/report/") or NODE_PAGE.fullmatch(path):
                page = server.page(path.removeprefix("/report").strip("/") or "index.html")
                if page is None:
                    self._send(503, "text/plain", b"no board yet: the first cycle has not finished\n")
                else:
                    self._send(200, "text/html; charset=utf-8", page)
            else:
                self._send(404, "text/plain", b"not found: /healthz, /metrics, /report\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("serve: http: " + format, *args)

    return Handler
