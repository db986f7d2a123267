"""serve's /metrics, through prometheus_client's own exposition (the text format, OpenMetrics when the
scraper asks, gzip when it accepts it), so an existing Prometheus and Alertmanager can alert on
stethoscope: open findings and incidents per node, the cycle's and the sweeps' durations and
outcomes, the executor's actions by outcome and the circuit breaker's limits, the re-baselines and
verifies not done, the collector's counters (rows stored among them: Prometheus computes their
rate), its writes' failures and the rows they hold at risk in memory, the process' own series and
the build. A series whose labels come from a fixed set has every one of them at 0 from the start,
so `increase()` sees the first event."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, Info, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder, gzip_accepted

import stethoscope
from stethoscope.catalog import default_catalog
from stethoscope.diagnosis.levels import SEVERITY_ORDER
from stethoscope.galaxy import GalaxyUnreadable, installed_collection
from stethoscope.remediation.action_events import ActionCounts, last_breaker
from stethoscope.remediation.incidents import enclosing_device, keeps_own
from stethoscope.serve.sweeps import HOST_STATES
from stethoscope.telemetry.udp_collector import PACKET_REASONS, VALUE_REASONS, WRITE_ERROR_KINDS

DURATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800)


@dataclass(frozen=True)
class Scrape:
    """One answer to a scrape: the body in the format the scraper asked for, gzipped if it accepts it."""

    content_type: str
    body: bytes
    encoding: str | None = None  # the Content-Encoding, "gzip", or None


class Exposition:
    """A registry of its own per server: the durations as histograms (observed as they happen), the
    process' series and the build, the rest read from the server's state at each scrape."""

    def __init__(self, server: Any):
        self.server = server
        self.registry = CollectorRegistry()
        self.cycle_seconds = Histogram(
            "stethoscope_cycle_duration_seconds",
            "seconds a diagnosis cycle took (evaluate, act, record, board)",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.sweep_seconds = Histogram(
            "stethoscope_sweep_duration_seconds",
            "seconds a sweep (collect.yml) took",
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)
        build = Info(
            "stethoscope_build", "the stethoscope package's and collection's versions", registry=self.registry
        )
        build.info({"version": stethoscope.__version__, "collection": collection_version()})
        self.registry.register(_State(server))
        self.registry.register(_Actions(ActionCounts()))

    def answer(self, accept: str | None, accept_encoding: str | None) -> Scrape:
        """The registry in the format the `Accept` header asks for (OpenMetrics, else Prometheus'
        text format), gzipped when `Accept-Encoding` allows it: prometheus_client's own negotiation."""
        encoder, content_type = choose_encoder(accept or "")
        body = encoder(self.registry)
        if gzip_accepted(accept_encoding or ""):
            return Scrape(content_type, gzip.compress(body), "gzip")
        return Scrape(content_type, body)


def collection_version() -> str:
    """The version in the collection's galaxy.yml; "unknown" where it cannot be read."""
    try:
        return installed_collection().version
    except GalaxyUnreadable:
        return "unknown"


class _State:
    def __init__(self, server: Any):
        self.server = server

    def collect(self):
        state = self.server.state
        yield from _findings(state.findings)
        cycles = CounterMetricFamily("stethoscope_cycles", "diagnosis cycles", labels=["outcome"])
        cycles.add_metric(["ok"], state.cycles)
        cycles.add_metric(["failed"], state.failures)
        yield cycles
        yield _counted(
            "stethoscope_rule_failures",
            "cycles in which a rule's evaluation failed (the other rules went on)",
            "rule_id",
            state.rule_failures,  # every rule of the last cycle, at 0 until it fails
        )
        yield from _upkeep(state.upkeep)
        if self.server.sweeper is not None:
            yield from _sweeps(self.server.sweeper.stats)
        if self.server.collector is not None:
            yield from _collector(self.server.collector)
            yield from node_refusal_families(self.server.collector)


class _Actions:
    """The executor's actions by short name and outcome (every pair from the start, at 0), and the
    circuit breaker as the last executing cycle armed it: each limit and what counts against it."""

    def __init__(self, counts: ActionCounts):
        self.counts = counts

    def collect(self):
        actions = CounterMetricFamily(
            "stethoscope_actions",
            "actions the executor finished, by action and outcome",
            labels=["action", "outcome"],
        )
        for (action, outcome), count in sorted(self.counts.snapshot().items()):
            actions.add_metric([action, outcome], count)
        yield actions
        limits = last_breaker().get("limits") or {}
        isolated = GaugeMetricFamily(
            "stethoscope_breaker_isolated",
            "nodes counting against each circuit-breaker limit (own, out_of_service, window), last armed",
            labels=["limit"],
        )
        allowed = GaugeMetricFamily(
            "stethoscope_breaker_limit", "each circuit-breaker limit at the last arming", labels=["limit"]
        )
        for name, limit in sorted(limits.items()):
            isolated.add_metric([name], limit["count"])
            allowed.add_metric([name], limit["limit"])
        yield isolated
        yield allowed


def _findings(findings: list[dict[str, Any]]):
    open_findings = GaugeMetricFamily(
        "stethoscope_findings_open",
        "open findings at the last cycle (held open ones included, silenced ones not)",
        labels=["node", "rule_id", "severity"],
    )
    counts: dict[tuple[str, str, str], int] = {}
    incidents: dict[tuple[str, str], str] = {}  # (node, incident) -> its worst severity
    for finding in findings:
        if finding.get("silenced"):  # a silence or maintenance holds it: nobody is to be paged
            continue
        key = (finding["node_id"], finding["rule_id"], finding["severity"])
        counts[key] = counts.get(key, 0) + 1
        incident = (finding["node_id"], _incident_of(finding))
        worst = incidents.get(incident)
        if worst is None or SEVERITY_ORDER[finding["severity"]] > SEVERITY_ORDER[worst]:
            incidents[incident] = finding["severity"]
    for (node, rule_id, severity), count in sorted(counts.items()):
        open_findings.add_metric([node, rule_id, severity], count)
    yield open_findings
    per_node: dict[tuple[str, str], int] = {}
    for (node, _incident), severity in incidents.items():
        per_node[(node, severity)] = per_node.get((node, severity), 0) + 1
    open_incidents = GaugeMetricFamily(
        "stethoscope_incidents_open",
        "open incidents (one transaction each: its findings, one ticket, one drain) by worst severity",
        labels=["node", "severity"],
    )
    for (node, severity), count in sorted(per_node.items()):
        open_incidents.add_metric([node, severity], count)
    yield open_incidents


def _incident_of(finding: dict[str, Any]) -> str:
    """Its transaction when acting; in a dry-run (no transactions), the device group an incident
    would be: the finding's enclosing device, or its own id where it keeps its own."""
    if finding.get("txn_id"):
        return str(finding["txn_id"])
    if keeps_own(finding["rule_id"], finding["node_id"]):
        return str(finding["finding_id"])
    return enclosing_device(default_catalog(), finding["device"])


def _upkeep(upkeep: Any):
    """Re-baselines not done (waiting: planned, for the window, the breaker or a later try; running;
    needs_person) and verifies of repaired incidents not finished, as the last cycle read them."""
    rebaselines = GaugeMetricFamily(
        "stethoscope_rebaselines", "re-baselines not done, by status (the actions table's)", labels=["state"]
    )
    for state, count in sorted(upkeep.rebaselines.items()):
        rebaselines.add_metric([state], count)
    yield rebaselines
    verifies = GaugeMetricFamily(
        "stethoscope_verifies",
        "incidents marked repaired whose verify has not finished: due (not started), running",
        labels=["state"],
    )
    for state, count in sorted(upkeep.verifies.items()):
        verifies.add_metric([state], count)
    yield verifies


def _sweeps(stats: Any):
    sweeps = CounterMetricFamily("stethoscope_sweeps", "sweeps serve ran", labels=["outcome"])
    sweeps.add_metric(["ok"], stats.ok)
    sweeps.add_metric(["failed"], stats.failed)
    sweeps.add_metric(["skipped"], stats.skipped)  # due while the last one still ran
    yield sweeps
    hosts = GaugeMetricFamily("stethoscope_sweep_hosts", "hosts of the last sweep", labels=["state"])
    for state, count in sorted(_every(HOST_STATES, stats.last_hosts).items()):
        hosts.add_metric([state], count)
    yield hosts
    running = GaugeMetricFamily("stethoscope_sweep_running", "1 while a sweep runs")
    running.add_metric([], 1 if stats.running else 0)
    yield running
    if stats.last_finished is not None:
        last = GaugeMetricFamily(
            "stethoscope_sweep_last_finished_timestamp_seconds", "unix time the last sweep ended"
        )
        last.add_metric([], stats.last_finished)
        yield last


def _collector(collector: Any):
    stats = collector.stats
    datagrams = CounterMetricFamily("stethoscope_telemetry_datagrams", "datagrams received")
    datagrams.add_metric([], stats.datagrams)
    yield datagrams
    duplicates = CounterMetricFamily("stethoscope_telemetry_duplicates", "resent copies already kept")
    duplicates.add_metric([], stats.duplicates)
    yield duplicates
    yield _counted(
        "stethoscope_telemetry_packets_rejected",
        "datagrams dropped",
        "reason",
        _every(PACKET_REASONS, stats.rejected),
    )
    yield _counted(
        "stethoscope_telemetry_values_rejected",
        "values of kept datagrams dropped alone (not a finite number)",
        "reason",
        _every(VALUE_REASONS, stats.values_rejected),
    )
    lost = CounterMetricFamily("stethoscope_telemetry_packets_lost", "samples no resend recovered")
    lost.add_metric([], sum(collector.guard.lost.values()))
    yield lost
    rows = CounterMetricFamily("stethoscope_telemetry_rows", "rows handed to the store", labels=["outcome"])
    rows.add_metric(["stored"], stats.stored)
    rows.add_metric(["spooled"], stats.spooled)
    yield rows
    yield from _writes(collector.write_health())


def _writes(health: Any):
    """The collector's writing side: what waits in memory because neither the store nor the spool
    took it, what was lost, and why writes failed."""
    at_risk = GaugeMetricFamily(
        "stethoscope_telemetry_rows_at_risk",
        "rows neither stored nor spooled (a full or read-only disk), held in memory for the next write",
    )
    at_risk.add_metric([], health.rows_at_risk)
    yield at_risk
    lost = CounterMetricFamily(
        "stethoscope_telemetry_rows_lost",
        "rows dropped beyond the in-memory hold's bound (STETHOSCOPE_HOLD_ROWS) or still held at stop",
    )
    lost.add_metric([], health.rows_lost)
    yield lost
    yield _counted(
        "stethoscope_telemetry_write_errors",
        "failed writes by kind: store (rows spooled), spool (rows held in memory), sink, flush",
        "kind",
        _every(WRITE_ERROR_KINDS, health.errors),
    )
    degraded = GaugeMetricFamily(
        "stethoscope_telemetry_write_degraded",
        "1 while the last write did not reach the store or rows are held in memory (/healthz says why)",
    )
    degraded.add_metric([], 0 if health.state == "ok" else 1)
    yield degraded


def node_refusal_families(collector: Any):
    """Per node whose MAC verified (a claimed node is never named): its datagrams refused, its streams
    re-synchronised after its clock or boot counter moved back, its job streams evicted for the cap."""
    refusals = collector.node_refusals()
    rejected = CounterMetricFamily(
        "stethoscope_telemetry_node_packets_rejected",
        "signed datagrams dropped, per node and reason (stale, replayed)",
        labels=["node", "reason"],
    )
    for (node, reason), count in sorted(refusals.rejected.items()):
        rejected.add_metric([node, reason], count)
    yield rejected
    yield _counted(
        "stethoscope_telemetry_stream_resyncs",
        "streams re-synchronised after their signed, fresh datagrams were refused as replayed for a while",
        "node",
        refusals.resyncs,
    )
    yield _counted(
        "stethoscope_telemetry_job_streams_evicted",
        "(job, rank) streams dropped from the replay guard for the per-node cap",
        "node",
        refusals.evicted,
    )


def _every(labels: tuple[str, ...], counts: dict[str, int]) -> dict[str, int]:
    """`counts` with every label of a fixed set present, at 0 until it is counted."""
    return {**dict.fromkeys(labels, 0), **counts}


def _counted(name: str, documentation: str, label: str, counts: dict[str, int]) -> CounterMetricFamily:
    """A counter with one label, a sample per key of `counts`."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, count in sorted(counts.items()):
        family.add_metric([key], count)
    return family
