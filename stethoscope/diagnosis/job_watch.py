"""Training jobs beside the rules (docs/design.md "Rules", jobs): a job that hangs, and the warm-up
through which the job-level rules hold off.

- `job.hung` (critical, L2, node_id `job:<id>`, `nodes` its ranks' nodes): a synchronous job whose
  ranks had been reporting (the stream's job part, labels job and rank) and whose newest report is
  older than SILENT_MIN_SECONDS, or SILENT_SPACINGS of its own reporting spacing when it reports
  more slowly (a job of minute-long steps is slow, not hung), while every node of its ranks that
  streams holds its GPUs' memory (the least over the last QUIET_SECONDS at least HELD_FRACTION of
  the median while it ran) at low utilisation (under IDLE_UTILIZATION % on average then): the
  seed's training stuck at 98 %, utilisation down to 5 %, memory still held. A job that ended frees
  its memory and is no hang. Per node, a cause this cycle's rule findings show there (an XID, a lost
  GPU, PCIe replays, a failing collector: CAUSE_METRICS) is named. Log and alert only: the job is
  no host to drain, and a node's own fault is drained by its own rule's finding.
- Warm-up: a job-level rule (one reading a metric of the stream's job part) holds off on a node
  while its window reaches into the first `stethoscope_job_warmup` (default 10m) of every job
  reporting there: a model learning from scratch has a high loss variance and uneven first steps.
  A job's start is its first report in the look-back (the warm-up and the rule's window, and a
  margin); a job older than that is past its warm-up. A job restarted under the same id is not
  seen to start again."""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from stethoscope.diagnosis.cadence import window_of
from stethoscope.diagnosis.engine import has_hourly_rollup
from stethoscope.diagnosis.levels import SEVERITY_ORDER, action_label, finding_id
from stethoscope.diagnosis.rules import Action, Rule, parse_duration
from stethoscope.store.client import Store
from stethoscope.timeutil import iso

HUNG_RULE = "job.hung"
WARMUP_SETTING = "stethoscope_job_warmup"
JOB_SETTINGS = (WARMUP_SETTING,)  # what JobWatch.of reads
DEFAULT_WARMUP_SECONDS = 600
MAX_WARMUP_SECONDS = 86400
SILENT_MIN_SECONDS = 120  # a checkpoint or an evaluation pass of a minute or two is no hang
SILENT_SPACINGS = 4
MIN_REPORTS = 3  # a rank's reports in the look-back: it had been reporting
REPORTS_LOOKBACK_SECONDS = 6 * 3600  # a job silent longer than this is left to the people told
# the memory a node held while the job ran: its median over these seconds before the last report
RUNNING_SECONDS = 300
IDLE_UTILIZATION = 20.0  # percent, the nodes' average since the last report
HELD_FRACTION = 0.5
MIN_QUIET_SAMPLES = 6  # 30 s of the stream
QUIET_SECONDS = 120  # how long the GPUs must have sat idle, memory held: the last of the silence
START_MARGIN_SECONDS = 60  # a first report this close to the look-back's start: the job began before it
CAUSE_METRICS = frozenset(
    {
        "gpu_xid_errors_total",
        "gpu_lost_events_total",
        "collector_gpu_lost",
        "collector_failed",
        "gpu_pcie_replay_errors_total",
        "gpu_pcie_replay_errors_per_second",
        "nvswitch_sxid_errors_total",
    }
)
LEVEL, SEVERITY, CONFIDENCE = "L2", "critical", 0.8
PLAN = (Action("log", ()), Action("alert", ()))  # the job is no host: no playbook
MESSAGE_CAP = 300


class JobSettingError(ValueError):
    """A job setting out of its range: the command exits 2 naming it."""


@cache
def job_metrics() -> frozenset[str]:
    """The metrics of the stream's job part (rules/telemetry.yml): what a job reports."""
    from stethoscope.telemetry.metric_set import load_sets

    return frozenset(slot.metric for s in load_sets().values() for slot in s.parts.get("job", ()))


@dataclass(frozen=True)
class JobWatch:
    warmup_seconds: int = DEFAULT_WARMUP_SECONDS

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> JobWatch:
        """From the inventory's settings; JobSettingError naming a bad one."""
        return cls(warmup_seconds(settings.get(WARMUP_SETTING, DEFAULT_WARMUP_SECONDS)))


def warmup_seconds(value: Any) -> int:
    """0 (no warm-up) to 1 day: whole seconds or a duration (10m)."""
    text = str(value).strip()
    seconds = int(text) if text.isdigit() else parse_duration(text)
    if isinstance(value, bool) or seconds is None or seconds > MAX_WARMUP_SECONDS:
        raise JobSettingError(
            f"{WARMUP_SETTING}: {value!r} is not a duration from 0 to 1d (such as 10m; 0: no warm-up)"
        )
    return seconds


@dataclass
class RankReports:
    node: str
    job: str
    rank: str
    first_ms: int
    last_ms: int
    reports: int

    @property
    def spacing_ms(self) -> float | None:
        return (self.last_ms - self.first_ms) / (self.reports - 1) if self.reports > 1 else None


def rank_reports(
    store: Store, at_ms: int, seconds: int, nodes: Sequence[str] | None, hourly: bool = False
) -> list[RankReports]:
    """Per (node, job, rank) that reported in the `seconds` before `at_ms`: its first and last report
    and how many (of its metric reported most). `hourly`: whole hours before `at_ms`'s own from
    metrics_hourly (a long look-back every cycle costs a row an hour a series), the rest raw."""
    params: dict[str, Any] = {"metrics": sorted(job_metrics()), "from": at_ms - seconds * 1000, "at": at_ms}
    common = ["metric_name IN {metrics:Array(String)}", "labels['job'] != ''"]
    if nodes is not None:
        common.append("node_id IN {nodes:Array(String)}")
        params["nodes"] = sorted(nodes)
    series = "node_id, labels['job'] AS job, labels['rank'] AS rank, metric_name"
    raw_from = "{from:Int64}"
    parts = []
    if hourly and has_hourly_rollup(store):
        params["hour"] = at_ms - at_ms % 3_600_000
        raw_from = "greatest({from:Int64}, {hour:Int64} - 1)"
        hours = [
            *common,
            "hour >= toStartOfHour(fromUnixTimestamp64Milli({from:Int64}, 'UTC'))",
            "hour < fromUnixTimestamp64Milli({hour:Int64}, 'UTC')",
        ]
        parts.append(
            f"SELECT {series}, toUnixTimestamp64Milli(min(first_at)) AS first_ms, "
            "toUnixTimestamp64Milli(max(last_at)) AS last_ms, sum(samples) AS n "
            f"FROM {store.database}.metrics_hourly WHERE {' AND '.join(hours)} "
            "GROUP BY node_id, job, rank, metric_name HAVING last_ms > {from:Int64}"
        )
    raw = [
        *common,
        f"timestamp > fromUnixTimestamp64Milli({raw_from}, 'UTC')",
        "timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')",
    ]
    parts.append(
        f"SELECT {series}, toUnixTimestamp64Milli(min(timestamp)) AS first_ms, "
        "toUnixTimestamp64Milli(max(timestamp)) AS last_ms, toUInt64(uniqExact(timestamp)) AS n "
        f"FROM {store.database}.metrics WHERE {' AND '.join(raw)} GROUP BY node_id, job, rank, metric_name"
    )
    per_metric = (
        "SELECT node_id, job, rank, metric_name, min(first_ms) AS first_ms, max(last_ms) AS last_ms, "
        f"sum(n) AS n FROM ({' UNION ALL '.join(parts)}) GROUP BY node_id, job, rank, metric_name"
    )
    rows = store.query(
        "SELECT node_id, job, rank, min(first_ms), max(last_ms), max(n) "
        f"FROM ({per_metric}) GROUP BY node_id, job, rank ORDER BY node_id, job, rank",
        params,
    )
    return [RankReports(str(n), str(j), str(r), int(f), int(la), int(c)) for n, j, r, f, la, c in rows]


# warm-up ------------------------------------------------------------------------------------------


def held_off(
    store: Store,
    rules: Sequence[Rule],
    matched: Sequence[tuple[Rule, Any]],
    at_ms: int,
    nodes: Sequence[str] | None,
    watch: JobWatch,
) -> set[tuple[str, str]]:
    """(rule_id, node_id) of the job-level matches to hold off: every job still reporting on the node
    (else every job that reported within the rule's window) is in its warm-up there. A job that ended
    just before the next one started on the same nodes does not cancel the new one's warm-up."""
    metrics = job_metrics()
    job_rules = {r.rule_id: r for r in rules if metrics & set(r.metrics)}
    if not watch.warmup_seconds or not any(r.rule_id in job_rules for r, _ in matched):
        return set()
    longest = max(window_of(r) for r in job_rules.values())
    lookback = watch.warmup_seconds + longest + 2 * START_MARGIN_SECONDS
    began_before_ms = at_ms - (lookback - START_MARGIN_SECONDS) * 1000
    jobs: dict[str, list[RankReports]] = {}
    for report in rank_reports(store, at_ms, lookback, nodes):
        jobs.setdefault(report.node, []).append(report)
    out = set()
    for rule, match in matched:
        if rule.rule_id not in job_rules:
            continue
        window_start = at_ms - window_of(rule) * 1000
        reporting = [r for r in jobs.get(match.node_id, []) if r.last_ms > window_start]
        running = [r for r in reporting if at_ms - r.last_ms <= SILENT_MIN_SECONDS * 1000]
        reporting = running or reporting
        warm = [
            r
            for r in reporting
            if r.first_ms > began_before_ms and r.first_ms + watch.warmup_seconds * 1000 > window_start
        ]
        if reporting and len(warm) == len(reporting):
            out.add((rule.rule_id, match.node_id))
    return out


# hung jobs ----------------------------------------------------------------------------------------


@dataclass
class NodeState:
    utilization: float | None = None  # average over the last QUIET_SECONDS of the silence
    held: float | None = None  # least memory then, as a share of the median while the job ran
    samples: int = 0

    @property
    def idle_and_held(self) -> bool:
        idle = self.utilization is not None and self.utilization < IDLE_UTILIZATION
        return idle and self.held is not None and self.held >= HELD_FRACTION


@dataclass
class HungJob:
    job: str
    ranks: int
    nodes: list[str]
    last_ms: int
    states: dict[str, NodeState] = field(default_factory=dict)
    causes: dict[str, list[str]] = field(default_factory=dict)


def silent_jobs(reports: list[RankReports], at_ms: int) -> dict[str, list[RankReports]]:
    """The jobs whose ranks had been reporting and whose newest report is past their silence."""
    by_job: dict[str, list[RankReports]] = {}
    for report in reports:
        by_job.setdefault(report.job, []).append(report)
    out = {}
    for job, ranks in by_job.items():
        if max(r.reports for r in ranks) < MIN_REPORTS:
            continue
        spacings = [s for s in (r.spacing_ms for r in ranks) if s is not None]
        spacing = statistics.median(spacings) if spacings else 0.0
        silent_ms = max(SILENT_MIN_SECONDS * 1000, SILENT_SPACINGS * spacing)
        if at_ms - max(r.last_ms for r in ranks) > silent_ms:
            out[job] = ranks
    return out


def _node_part(store: Store, where: str, select: str) -> str:
    """The stream's node-part utilisation and memory rows (each timestamp once) under `where`,
    aggregated per node by `select`."""
    samples = (
        "SELECT node_id, metric_name, timestamp, any(value) AS value "
        f"FROM {store.database}.metrics WHERE node_id IN {{nodes:Array(String)}} "
        "AND metric_name IN ('gpu_utilization_percent', 'gpu_memory_used_mib') AND device = 'node' "
        f"AND labels['source'] = 'stream' AND {where} GROUP BY node_id, metric_name, timestamp"
    )
    return f"SELECT node_id, {select} FROM ({samples}) GROUP BY node_id"


UTILIZATION, MEMORY = "metric_name = 'gpu_utilization_percent'", "metric_name = 'gpu_memory_used_mib'"


def node_states(store: Store, nodes: list[str], last_ms: int, at_ms: int) -> dict[str, NodeState]:
    """Per node its utilisation and least memory over the last QUIET_SECONDS (at most since the
    job's last report); where it is idle, that memory as a share of its median in the
    RUNNING_SECONDS before the last report."""
    quiet = (
        "timestamp > fromUnixTimestamp64Milli({since:Int64}, 'UTC') "
        "AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')"
    )
    now = store.query(
        _node_part(
            store, quiet, f"avgIf(value, {UTILIZATION}), countIf({UTILIZATION}), minIf(value, {MEMORY})"
        ),
        {"nodes": nodes, "since": max(last_ms, at_ms - QUIET_SECONDS * 1000), "at": at_ms},
    )
    states = {str(node): NodeState(float(util), None, int(n)) for node, util, n, _ in now if n}
    idle = [
        node for node, s in states.items() if s.utilization is not None and s.utilization < IDLE_UTILIZATION
    ]
    if not idle:
        return states  # busy GPUs: no hang to weigh memory for
    least = {str(node): float(memory) for node, _, n, memory in now if n}
    running = (
        "timestamp > fromUnixTimestamp64Milli({from:Int64}, 'UTC') "
        "AND timestamp <= fromUnixTimestamp64Milli({last:Int64}, 'UTC')"
    )
    before = store.query(
        _node_part(store, running, f"quantileExactIf(0.5)(value, {MEMORY}), countIf({MEMORY})"),
        {"nodes": idle, "from": last_ms - RUNNING_SECONDS * 1000, "last": last_ms},
    )
    for node, median, n in before:
        if n and median > 0 and str(node) in least:
            states[str(node)].held = least[str(node)] / float(median)
    return states


def hung_jobs(
    store: Store,
    at_ms: int,
    nodes: Sequence[str] | None,
    findings: Sequence[dict[str, Any]],
    rules: Sequence[Rule],
) -> list[HungJob]:
    """The silent jobs whose every node that streams is idle with its memory held; `findings`: this
    cycle's rule findings, which name the causes."""
    out = []
    reports = rank_reports(store, at_ms, REPORTS_LOOKBACK_SECONDS, nodes, hourly=True)
    for job, ranks in sorted(silent_jobs(reports, at_ms).items()):
        hosts = sorted({r.node for r in ranks})
        last_ms = max(r.last_ms for r in ranks)
        if any(r.job != job and r.node in hosts and r.last_ms > last_ms for r in reports):
            continue  # its nodes went on to another job: this one ended
        states = node_states(store, hosts, last_ms, at_ms)
        judged = [s for s in states.values() if s.samples >= MIN_QUIET_SAMPLES]
        if not judged or not all(s.idle_and_held for s in judged):
            continue  # memory freed (the job ended), busy GPUs, or no stream to tell
        out.append(HungJob(job, len(ranks), hosts, last_ms, states, causes(findings, rules, hosts)))
    return out


def causes(
    findings: Sequence[dict[str, Any]], rules: Sequence[Rule], hosts: list[str]
) -> dict[str, list[str]]:
    """Per node of `hosts`, the rule findings (warning or worse) of this cycle that name a cause a
    rank hangs on: "gpu_xid_79 gpu3"."""
    reading = {r.rule_id for r in rules if CAUSE_METRICS & set(r.metrics)}
    out: dict[str, list[str]] = {}
    for f in findings:
        if f["rule_id"] in reading and f["node_id"] in hosts and SEVERITY_ORDER[f["severity"]] >= 1:
            out.setdefault(f["node_id"], []).append(f"{f['rule_id']} {f['device']}".strip())
    return {node: sorted(set(named)) for node, named in sorted(out.items())}


def hung_finding(hung: HungJob, at_ms: int) -> dict[str, Any]:
    judged = [s for s in hung.states.values() if s.samples >= MIN_QUIET_SAMPLES]
    utilization = max(s.utilization or 0.0 for s in judged)
    held = min(s.held or 0.0 for s in judged)
    silent = (at_ms - hung.last_ms) // 1000
    said = (
        f"job {hung.job} hung: no report from its {hung.ranks} ranks on {len(hung.nodes)} nodes for "
        f"{silent // 60}m{silent % 60:02d}s while their GPUs hold {held * 100:.0f} % of their memory at "
        f"{utilization:.0f} % utilisation"
    )
    if hung.causes:
        said += "; cause on " + "; ".join(f"{n}: {', '.join(c)}" for n, c in hung.causes.items())
    said = said if len(said) <= MESSAGE_CAP else said[: MESSAGE_CAP - 1].rstrip(" ,;") + "…"
    evidence = {
        "job": hung.job,
        "ranks": hung.ranks,
        "nodes": hung.nodes,
        "last_report": iso(hung.last_ms),
        "silent_seconds": silent,
        "utilization": _rounded({n: s.utilization for n, s in hung.states.items()}, 1),
        "memory_held": _rounded({n: s.held for n, s in hung.states.items()}, 3),
        "causes": hung.causes,
        "metrics": ["train_step_time_ms"],  # the board's band: the job's (its nodes' faults have theirs)
    }
    node_id = f"job:{hung.job}"
    return {
        "finding_id": finding_id(HUNG_RULE, node_id, ""),
        "rule_id": HUNG_RULE,
        "node_id": node_id,
        "device": "",
        "severity": SEVERITY,
        "confidence": CONFIDENCE,
        "level": LEVEL,
        "first_seen": iso(at_ms),
        "message": said,
        "evidence": json.dumps(evidence, sort_keys=True),
        "actions": [action_label(a) for a in PLAN],
        "value": float(silent),
        "values": {HUNG_RULE: float(silent)},
        "nodes": hung.nodes,
        "plan": PLAN,
        "cooldown_seconds": 3600,
        "rule_message": None,
        "window_seconds": SILENT_MIN_SECONDS,
    }


def _rounded(values: dict[str, float | None], digits: int) -> dict[str, float]:
    return {name: round(value, digits) for name, value in values.items() if value is not None}
