"""`stethoscope serve`: the one long-running controller (docs/design.md "Telemetry"): the stream's
collector, the sweeps (serve.sweeps), the diagnosis cycle every interval (remediation.cycle, the
same cycle `diagnose` and `watch` run: acting only with --execute) with the board it writes, and an
HTTP endpoint on loopback (/healthz, /metrics, /report). Each cycle writes one log line (text, or
JSON with --log-format json).

With the embedded default, serve is the database's only owner while it runs: it holds one handle
open from start to stop, and answers other local processes' statements (the CLI, the callback,
`ingest`, playbook runs) through its relay (serve/relay.py); what was spooled meanwhile the
collector's writer replays with each batch.
chdb runs queries from several threads of one process at once (benchmarks/chdb_threads.py), so the
cycle reads through that handle while the collector's writing thread inserts through its own.

SIGTERM and SIGINT stop it gracefully: the collector stops receiving, takes what the socket still
holds, and writes (or spools) everything before the handle closes.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.findings import RULE_FAILED
from stethoscope.diagnosis.rules import Rule
from stethoscope.remediation.action_events import publish_breaker
from stethoscope.remediation.alertmanager import AlertmanagerSink
from stethoscope.remediation.breaker_state import armed
from stethoscope.remediation.cycle import CycleResult, Cycles
from stethoscope.remediation.plan import preview, render_plan
from stethoscope.remediation.published import NAME, Identity, document
from stethoscope.remediation.rebaseline import Outstanding, outstanding
from stethoscope.report import board
from stethoscope.serve.exposition import Exposition, Scrape
from stethoscope.serve.http import bind, handler
from stethoscope.serve.relay import Relay
from stethoscope.serve.scrape import Scraper
from stethoscope.serve.sweeps import Sweeper
from stethoscope.serve.verdicts import Verdicts, default_grace, room_for
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import redact
from stethoscope.store.writer import Writer
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import MetricSet
from stethoscope.telemetry.udp_collector import WRITE_TIMEOUT, Collector
from stethoscope.terminal import terminal_safe
from stethoscope.timeutil import iso

log = logging.getLogger(__name__)


@dataclass
class CycleState:
    cycles: int = 0
    failures: int = 0
    last_at: float | None = None
    last_error: str | None = None
    last: CycleResult | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    report: Path | None = None  # the board's index.html, written by the last cycle
    durations: list[float] = field(default_factory=list)  # seconds of every cycle, for its p99
    rows_per_second: float = 0.0  # rows the collector stored between the last two cycles
    board_error: str | None = None  # why the last board was not written (the cycle itself went on)
    rule_failures: Counter = field(default_factory=Counter)  # rule_id -> cycles its evaluation failed
    published: dict[str, Any] | None = None  # the last cycle's evaluation (remediation.published)
    upkeep: Outstanding = field(default_factory=Outstanding)  # re-baselines and verifies not done


class Server:
    def __init__(
        self,
        *,
        store: Store,
        spool_dir: Path,
        keyring: Keyring,
        sets: dict[int, MetricSet],
        listen: tuple[str, int],
        http: tuple[str, int] | None,
        interval: float,
        rules: Callable[[], list[Rule]],
        catalog: Catalog,
        cycles: Cycles,
        sweeper: Sweeper | None = None,
        flush_interval: float = 1.0,
        log_format: str = "text",
        replay_dir: Path | None = None,
        gate_http: tuple[str, int] | None = None,
        identity: Callable[[list[Rule]], Identity] | None = None,
        scraper: Scraper | None = None,
        alert_sink: AlertmanagerSink | None = None,
    ):
        self.store = store  # opened by start(), held until stop()
        self.spool_dir = spool_dir
        self.report_dir = spool_dir.parent / "report"  # beside the spool: .stethoscope/report
        self.keyring, self.sets, self.listen, self.http_address = keyring, sets, listen, http
        self.interval, self.rules, self.catalog = interval, rules, catalog
        self.cycles = cycles
        cycles.background = True  # playbooks never stall diagnosis: actions run beside the cycles
        if cycles.execute_with is not None:  # the first executing cycle logs what it will do
            cycles.before_acting = self._log_plan
        self.sweeper = sweeper
        self.scraper = scraper  # the exporters the inventory lists, as sources (serve.scrape)
        self.alert_sink = alert_sink  # Alertmanager: the open findings kept firing, the cleared resolved
        self.flush_interval = flush_interval
        self.log_format = log_format
        self.replay_dir = replay_dir  # the collector's replay window across restarts
        self.state = CycleState()
        self.stop_event = threading.Event()
        self.collector: Collector | None = None
        self.httpd: ThreadingHTTPServer | None = None
        self.gate_address = gate_http  # --gate-listen: GET /gate/<node> only, for the nodes
        self.gate_httpd: ThreadingHTTPServer | None = None
        self.relay: Relay | None = None
        self.identity = identity  # rules -> what the commands beside serve compare (published)
        self.started = time.time()
        self._stored_at_last: tuple[int, float] = (0, time.monotonic())
        self.exposition = Exposition(self)
        self.verdicts = Verdicts(keyring, default_grace(interval))  # the Slurm gate's, per node
        if sweeper is not None:
            sweeper.on_done = lambda seconds: self.exposition.sweep_seconds.observe(seconds)
        if scraper is not None:
            self.exposition.registry.register(scraper)

    # life -------------------------------------------------------------------------------------
    def start(self) -> Server:
        if self.http_address is not None:  # first: a busy address refuses the start, nothing held
            self.httpd = bind(self.http_address, handler(self))
        if self.gate_address is not None:
            try:
                self.gate_httpd = bind(self.gate_address, handler(self, gate_only=True), "--gate-listen")
            except BaseException:
                if self.httpd is not None:
                    self.httpd.server_close()
                raise
        writer = Writer(self.store.dsn, self.spool_dir, timeout=WRITE_TIMEOUT)
        try:
            self.collector = Collector(
                self.keyring,
                self.sets,
                writer.write,
                listen=self.listen,
                flush_interval=self.flush_interval,
                state_dir=self.replay_dir,
            )
        except BaseException:
            for httpd in (self.httpd, self.gate_httpd):
                if httpd is not None:
                    httpd.server_close()
            raise
        self.store.open()  # held until stop: the embedded database's only owner
        self.store.ensure_schema()
        self._publish_breaker()
        try:  # other processes' statements, answered through this handle (serve/relay.py)
            self.relay = Relay(self.store, self._document).start()
        except OSError as exc:  # serve runs on; other commands then wait for the database, as before
            print(f"stethoscope: serve: relay not started: {exc}", file=sys.stderr, flush=True)
        self.collector.start()
        if self.httpd is not None:
            threading.Thread(target=self.httpd.serve_forever, name="stethoscope-http", daemon=True).start()
        if self.gate_httpd is not None:
            gates = self.gate_httpd.serve_forever
            threading.Thread(target=gates, name="stethoscope-gate", daemon=True).start()
        if self.sweeper is not None:
            self.sweeper.start()
        if self.scraper is not None:  # its rows through the collector's writer and spool
            self.scraper.start(writer.write)
        return self

    def _publish_breaker(self) -> None:
        """The breaker's gauges from the start, before the first executing cycle arms it."""
        if self.cycles.execute_with is None:
            return
        try:
            context = self.cycles.execute_with(self.store.dsn, self.store.database)
            publish_breaker(armed(self.store, context).state())
        except (StoreError, OSError) as exc:  # the first cycle arms it again
            print(f"stethoscope: serve: breaker not armed at start: {exc}", file=sys.stderr, flush=True)

    def run(self, cycles: int = 0) -> None:
        """Diagnose every interval until stopped (or `cycles` have run)."""
        while not self.stop_event.is_set():
            self.cycle()
            if cycles and self.state.cycles + self.state.failures >= cycles:
                break
            self.stop_event.wait(self.interval)

    def stop(self) -> None:
        self.stop_event.set()
        if self.sweeper is not None:
            self.sweeper.stop()
        if self.scraper is not None:
            self.scraper.stop()
        for httpd in (self.httpd, self.gate_httpd):
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
        if self.collector is not None:
            self.collector.stop()  # drains the socket, writes or spools everything
        running = self.cycles.actions_running()
        if running:  # killed meanwhile, the next start reconciles them (remediation.reconcile)
            print(f"serve: waiting for the actions of {running} incidents to finish", flush=True)
        try:
            self.cycles.close()
        except Exception as exc:  # the heartbeat's last row: the store may be why serve stops
            log.warning("serve: on stop: %s", redact(str(exc)))
        if self.relay is not None:  # its readers close before the handle they read beside
            self.relay.stop()
        self.store.close()

    # the cycle --------------------------------------------------------------------------------
    def cycle(self) -> None:
        at_ms = int(time.time() * 1000)
        started = time.monotonic()
        rules = self.rules()
        self.state.rule_failures.update(dict.fromkeys((rule.rule_id for rule in rules), 0))  # /metrics: at 0
        try:
            result = self.cycles.run(rules, at_ms, store=self.store)
            self.state.rule_failures.update(result.failed_rules)
            if result.every_rule_failed:  # nothing diagnosed: the cycle failed, whatever else it did
                first = next(f for f in result.findings if f["rule_id"] == RULE_FAILED)
                raise RuntimeError(f"every rule failed; the first: {first['message']}")
        except Exception as exc:  # the store may come back, a rule be fixed: the next cycle tries again
            self.state.failures += 1
            self.state.last_error = f"{type(exc).__name__}: {redact(str(exc))}"
            self._log_cycle(at_ms, time.monotonic() - started, None)
            return
        self._write_board(at_ms, rules, result)  # first: a cycle /healthz counts has its board served
        if self.alert_sink is not None and result.acted:
            self.alert_sink.publish(result.findings, at_ms)
        self.state.cycles += 1
        self.state.last_at = time.time()
        self.state.last_error = None
        self.state.last = result
        self.state.findings = result.findings
        if self.identity is not None:  # diagnose and summary beside serve answer from it
            self.state.published = document(result, self.identity(rules), self.interval)
        self._read_upkeep()
        room = room_for(self.store, self.cycles)  # the breaker caps the gates' failures
        self.verdicts.publish(result.findings, at_ms, result.executing, room)
        self._log_cycle(at_ms, time.monotonic() - started, result)

    def _read_upkeep(self) -> None:
        """The re-baselines and verifies not done, as the ledger holds them after this cycle; one the
        store cannot answer keeps the last (the cycle itself is done)."""
        try:
            self.state.upkeep = outstanding(self.store)
        except StoreError as exc:
            print(
                f"stethoscope: serve: re-baselines not read: {redact(str(exc))}", file=sys.stderr, flush=True
            )

    def _document(self, name: str) -> dict[str, Any] | None:
        """What the relay hands a command beside serve that asks for `name`."""
        return self.state.published if name == NAME else None

    def _write_board(self, at_ms: int, rules: list[Rule], result: CycleResult) -> None:
        """The board of this cycle's findings; one that cannot be written costs the board only (the
        cycle diagnosed and acted): the last board stays served and the error is said."""
        try:
            today = board.collect(self.store, self.catalog, 7, at_ms, rules, today=result.findings)
            self.state.report = board.write(today, self.report_dir)
            self.state.board_error = None
        except Exception as exc:
            self.state.board_error = f"{type(exc).__name__}: {redact(str(exc))}"
            print(
                f"stethoscope: serve: board not written: {terminal_safe(self.state.board_error)}",
                file=sys.stderr,
                flush=True,
            )

    def _log_plan(
        self, context: Any, findings: list[dict[str, Any]], rules: list[Rule], at_ms: int, seen: Any
    ) -> None:
        """The plan of the first executing cycle (remediation.plan), logged before it acts; a plan
        that cannot be made costs its lines only."""
        try:
            with Store(context.dsn, context.database) as store:
                entries = preview(store, context, findings, rules, at_ms, seen)
        except Exception as exc:
            print(f"stethoscope: serve: plan not made: {redact(str(exc))}", file=sys.stderr, flush=True)
            return
        record = {"event": "plan", "at": iso(at_ms), "incidents": entries}
        text = "serve: " + render_plan(entries).replace("\n", "\nserve:   ")
        print(text if self.log_format == "text" else json.dumps(record, sort_keys=True), flush=True)

    def _log_cycle(self, at_ms: int, seconds: float, result: CycleResult | None) -> None:
        """One line per cycle: what it found and did, how long it took, what the store took since."""
        self.state.durations.append(seconds)
        del self.state.durations[:-10_000]
        self.exposition.cycle_seconds.observe(seconds)
        stored = self.collector.stats.stored if self.collector else 0
        before, since = self._stored_at_last
        self._stored_at_last = (stored, time.monotonic())
        self.state.rows_per_second = (stored - before) / max(time.monotonic() - since, 1e-6)
        record: dict[str, Any] = {
            "event": "cycle",
            "at": iso(at_ms),
            "cycle": self.state.cycles + self.state.failures,
            "seconds": round(seconds, 3),
            "ok": result is not None,
            "error": self.state.last_error,
            "rows_stored_per_second": round(self.state.rows_per_second, 1),
        }
        if result is not None:
            severities: dict[str, int] = {}
            for finding in result.findings:
                severities[finding["severity"]] = severities.get(finding["severity"], 0) + 1
            record.update(
                rules=result.rules,
                findings=len(result.findings),
                by_severity=dict(sorted(severities.items())),
                nodes=len({f["node_id"] for f in result.findings}),
                held=sum(1 for f in result.findings if f.get("held")),
                executing=result.executing,
                standby=result.standby or None,
            )
        if self.sweeper is not None:
            stats = self.sweeper.stats
            record["sweeps"] = {"ok": stats.ok, "failed": stats.failed, "skipped": stats.skipped}
        print(_line(record) if self.log_format == "text" else json.dumps(record), flush=True)
        if self.state.last_error:
            print(f"stethoscope: serve: cycle failed: {self.state.last_error}", file=sys.stderr, flush=True)

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
        writes = self.collector.write_health() if self.collector else None
        degraded = writes is not None and writes.state != "ok"  # rows not in the store, or at risk
        body: dict[str, Any] = {
            "status": "failing" if not ok else "degraded" if degraded else "ok",
            "cycles": self.state.cycles,
            "cycle_failures": self.state.failures,
            "last_cycle": self.state.last_at,
            "last_error": self.state.last_error,
            "board_error": self.state.board_error,
            "collector": {
                "datagrams": stats.datagrams if stats else 0,
                "stored_rows": stats.stored if stats else 0,
                "spooled_rows": stats.spooled if stats else 0,
                "last_write_error": stats.last_error if stats else None,
                "write_state": writes.state if writes else "ok",
                "write_problem": writes.reason if writes else None,
                "rows_at_risk": writes.rows_at_risk if writes else 0,
                "rows_lost": writes.rows_lost if writes else 0,
            },
        }
        if self.sweeper is not None:
            sweeps = self.sweeper.stats
            body["sweeps"] = {
                "ok": sweeps.ok,
                "failed": sweeps.failed,
                "skipped": sweeps.skipped,
                "running": sweeps.running,
                "last_seconds": sweeps.last_seconds,
                "last_hosts": sweeps.last_hosts,
                "last_error": sweeps.last_error,
            }
        # degraded is 200: a liveness probe that restarted serve would lose the rows it holds
        return (503 if body["status"] == "failing" else 200), body

    def gate(self, node: str) -> tuple[int, bytes]:
        """The node's last signed verdict for its Slurm gate (serve.verdicts)."""
        return self.verdicts.answer(node)

    def metrics(self, accept: str | None = None, accept_encoding: str | None = None) -> Scrape:
        """/metrics in the format `accept` asks for, gzipped where `accept_encoding` allows it."""
        return self.exposition.answer(accept, accept_encoding)


def _mode(record: dict[str, Any]) -> str:
    """An executing serve that stands by says so and why; never "dry-run"."""
    if not record["executing"]:
        return "dry-run"
    return f"standby ({terminal_safe(record['standby'])})" if record["standby"] else "acting"


def _line(record: dict[str, Any]) -> str:
    """The cycle's log line as text: `serve: cycle N at T: 0.8 s, ...`."""
    head = f"serve: cycle {record['cycle']} at {record['at']}: {record['seconds']:.2f} s"
    if not record["ok"]:
        return f"{head}, FAILED: {terminal_safe(record['error'])}"
    worst = ", ".join(f"{n} {s}" for s, n in record["by_severity"].items())
    parts = [
        f"{record['rules']} rules",
        f"{record['findings']} findings" + (f" ({worst})" if worst else "") + f" on {record['nodes']} nodes",
        f"{record['held']} held open",
        _mode(record),
        f"{record['rows_stored_per_second']:.0f} rows/s stored",
    ]
    if "sweeps" in record:
        sweeps = record["sweeps"]
        parts.append(f"sweeps {sweeps['ok']} ok, {sweeps['failed']} failed, {sweeps['skipped']} skipped")
    return f"{head}, " + ", ".join(parts)
