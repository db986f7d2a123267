"""`stethoscope outcomes`: how fast the loop saw, isolated and ticketed, per ISO week and catalog layer,
computed in ClickHouse over `findings`, `actions`, `faults` and `metrics` (nothing loaded into Python
but the result rows).

An incident is a transaction; its layer and start are those of the finding that opened it (the
earliest first_seen of the transaction), its week the ISO week of that start (UTC). A finding that
opens again under a new transaction (resumed without repair) keeps its finding_id, so once ClickHouse
merges `findings` only its newest transaction's row is left: an older transaction is then known from
its `actions` rows, its start the earliest started_at of its finding's actions.

First evidence (MTTD = the opening finding's first_seen minus it), exactly from what is stored:
- the earliest sample, inside the rule's window before first_seen, of the rule's own metric (its first
  condition, with that condition's labels) on the finding's node and device that shows the condition:
  for a condition on a raw value (last, max, min, avg, p99) a sample past its threshold; for an increase
  (delta, rate) the first sample above the lowest of that series in the window (the counter began to
  grow);
- or, when earlier, the impact of a fault confirmed on that node and layer (`fault confirm`) in the
  6 hours before first_seen.
A rule judged on a trend or a baseline (slope, cv, growth, deviation), a model finding and an UNKNOWN
have no such sample and no confirmed fault: they count as incidents, not in MTTD (its `n` says how many).

Time to isolation: first_seen to the finished_at of the incident's drain that ended ok; to ticket: to
that of its ticket playbook that ended ok; L4 ticket: the same over the incidents whose opening finding
was of level L4 alone (the seed's handling figure is an L4 incident's: like is compared with like).
Repairs: incidents verify resumed (a `resume` row); resumed
without repair: an incident with an action row whose action or detail says "resumed without repair"
(the escalation remediation/repair.py records re-isolating such a node); needs a person: a
`needs_person` row; refused by the breaker: an action that was ever `refused`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from stethoscope.aggregates import REGISTRY
from stethoscope.catalog import Catalog
from stethoscope.diagnosis.audit import MODEL_LAYERS
from stethoscope.diagnosis.layers import rule_layer
from stethoscope.diagnosis.rules import Rule
from stethoscope.remediation.ledger import DRAIN, NEEDS_PERSON, RESUME, TICKET
from stethoscope.remediation.repair import RESUMED_WITHOUT_REPAIR
from stethoscope.store.client import Store
from stethoscope.timeutil import iso

# the seed's figures: minutes from first evidence to a finding, and an L4 incident's
# handling from the finding to its ticket
REFERENCE = {"mttd_minutes": 47.0, "l4_handling_minutes": 19.0}
FAULT_REACH_MS = 6 * 3_600_000  # as far back as `fault confirm` keeps a node's raw rows
OTHER = "other"  # a finding of no rule in the rule set (UNKNOWN, a removed rule)
ALL = "all"
DEFINITION = (
    "MTTD: first evidence to finding; first evidence = the earliest sample of the rule's own metric in "
    "its window before the finding past its threshold (an increase: above the window's lowest), or an "
    "earlier confirmed fault's impact; trend, baseline, model and UNKNOWN findings have none (n)"
)


@dataclass(frozen=True)
class Spread:
    """Minutes: the median and 90th percentile (linear interpolation) of `n` incidents."""

    median: float | None
    p90: float | None
    n: int

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "p90": self.p90, "n": self.n}


@dataclass(frozen=True)
class OutcomeRow:
    week: str  # ISO week, e.g. 2026-W49, or "all"
    layer: str  # a catalog layer, "other", or "all"
    incidents: int
    mttd: Spread
    isolation: Spread
    ticket: Spread
    l4_ticket: Spread  # the ticket times of L4 incidents alone: the seed's handling figure is an L4's
    repairs: int
    resumed_without_repair: int
    needs_person: int
    refused_by_breaker: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "week": self.week,
            "layer": self.layer,
            "incidents": self.incidents,
            "mttd_minutes": self.mttd.as_dict(),
            "isolation_minutes": self.isolation.as_dict(),
            "ticket_minutes": self.ticket.as_dict(),
            "l4_ticket_minutes": self.l4_ticket.as_dict(),
            "repairs": self.repairs,
            "resumed_without_repair": self.resumed_without_repair,
            "needs_person": self.needs_person,
            "refused_by_breaker": self.refused_by_breaker,
        }


@dataclass
class Outcomes:
    since_ms: int
    until_ms: int
    rows: list[OutcomeRow] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "since": iso(self.since_ms),
            "until": iso(self.until_ms),
            "reference": dict(REFERENCE),
            "definition": DEFINITION,
            "rows": [row.as_dict() for row in self.rows],
        }


@dataclass(frozen=True)
class _Sign:
    """How a rule's own condition shows in one sample; mode '' when no sample can show it."""

    rule_id: str
    layer: str
    metric: str = ""
    operator: str = ""
    threshold: float = 0.0
    window_ms: int = 0
    mode: str = ""  # raw: a sample past the threshold | increase: above the window's lowest
    labels: tuple[tuple[str, str], ...] = ()


def _sign(rule: Rule, catalog: Catalog) -> _Sign:
    layer = rule_layer(rule, catalog)
    own = rule.conditions[0] if rule.conditions else None
    if own is None or own.baseline is not None or not math.isfinite(own.threshold):
        return _Sign(rule.rule_id, layer)
    aggregate = REGISTRY[own.aggregate]
    if aggregate.sample_evidence:
        mode = "raw"
    elif aggregate.increase:
        mode = "increase"
    else:
        return _Sign(rule.rule_id, layer)
    window_ms = own.window_seconds * 1000
    return _Sign(rule.rule_id, layer, own.metric, own.operator, own.threshold, window_ms, mode, own.labels)


def _rule_columns(rules: list[Rule], catalog: Catalog) -> dict[str, list[Any]]:
    """The rules' signs as the query's array parameters, model findings' layers among them."""
    signs = [_sign(rule, catalog) for rule in rules]
    signs += [_Sign(rule_id, layers[0]) for rule_id, layers in MODEL_LAYERS.items()]
    return {
        "ids": [s.rule_id for s in signs],
        "layers": [s.layer for s in signs],
        "metrics": [s.metric for s in signs],
        "ops": [s.operator for s in signs],
        "thr": [float(s.threshold) for s in signs],
        "win": [s.window_ms for s in signs],
        "mode": [s.mode for s in signs],
        "keys": [[k for k, _ in s.labels] for s in signs],
        "values": [[v for _, v in s.labels] for s in signs],
    }


_PASSES = (
    "multiIf(o.op = '>', m.value > o.thr, o.op = '>=', m.value >= o.thr, o.op = '<', m.value < o.thr, "
    "o.op = '<=', m.value <= o.thr, o.op = '==', m.value = o.thr, o.op = '!=', m.value != o.thr, "
    "o.op = 'has_bits', bitAnd(toUInt64(if(isFinite(m.value), greatest(m.value, 0), 0)), "
    "toUInt64(o.thr)) != 0, 0)"
)

_QUERY = """
WITH
rules AS (
  SELECT t.1 AS rule_id, t.2 AS layer, t.3 AS metric, t.4 AS op, t.5 AS thr, t.6 AS win, t.7 AS mode,
    t.8 AS label_keys, t.9 AS label_values
  FROM (SELECT arrayJoin(arrayZip({ids:Array(String)}, {layers:Array(String)}, {metrics:Array(String)},
    {ops:Array(String)}, {thr:Array(Float64)}, {win:Array(Int64)}, {mode:Array(String)},
    {keys:Array(Array(String))}, {values:Array(Array(String))})) AS t)
),
identity AS (
  SELECT finding_id, argMax(rule_id, version) AS rule_id, argMax(node_id, version) AS node_id,
    argMax(device, version) AS device, argMax(level, version) AS level
  FROM {db}.findings GROUP BY finding_id
),
recorded AS (
  SELECT finding_id, txn_id, toUnixTimestamp64Milli(argMax(first_seen, version)) AS seen_ms
  FROM {db}.findings WHERE txn_id != '' GROUP BY finding_id, txn_id
),
starts AS (
  SELECT finding_id, txn_id, seen_ms FROM recorded
  UNION ALL
  SELECT finding_id, txn_id, toUnixTimestamp64Milli(min(started_at)) AS seen_ms FROM {db}.actions
  WHERE finding_id != '' AND txn_id != '' AND txn_id NOT IN (SELECT txn_id FROM recorded)
  GROUP BY finding_id, txn_id
),
opened AS (
  SELECT txn_id, argMin(finding_id, seen_ms) AS finding_id, min(seen_ms) AS first_ms
  FROM starts GROUP BY txn_id
  HAVING first_ms >= {since:Int64} AND first_ms <= {until:Int64}
),
incidents AS (
  SELECT o.txn_id AS txn_id, f.node_id AS node_id, f.device AS device, o.first_ms AS first_ms,
    f.level = 'L4' AS l4,
    if(r.layer = '', {other:String}, r.layer) AS layer, r.metric AS metric, r.op AS op, r.thr AS thr,
    r.win AS win, r.mode AS mode, r.label_keys AS label_keys, r.label_values AS label_values
  FROM opened AS o INNER JOIN identity AS f ON o.finding_id = f.finding_id
  LEFT JOIN rules AS r ON f.rule_id = r.rule_id
),
samples AS (
  SELECT o.txn_id AS txn_id, toUnixTimestamp64Milli(m.timestamp) AS ts, m.value AS value, o.mode AS mode,
    {passes} AS passes,
    min(m.value) OVER (PARTITION BY o.txn_id, m.device, m.labels_key) AS low
  FROM (SELECT node_id, metric_name, device, labels, labels_key, value, timestamp FROM {db}.metrics
        WHERE node_id IN (SELECT node_id FROM incidents WHERE mode != '')
          AND metric_name IN (SELECT metric FROM incidents WHERE mode != '')
          AND timestamp >= fromUnixTimestamp64Milli({reach:Int64}, 'UTC')) AS m
  INNER JOIN (SELECT * FROM incidents WHERE mode != '') AS o
    ON m.node_id = o.node_id AND m.metric_name = o.metric
  WHERE (o.device = '' OR m.device = o.device)
    AND toUnixTimestamp64Milli(m.timestamp) > o.first_ms - o.win
    AND toUnixTimestamp64Milli(m.timestamp) <= o.first_ms
    AND arrayAll((k, v) -> m.labels[k] = v, o.label_keys, o.label_values)
),
sampled AS (
  SELECT txn_id, minIf(ts, if(mode = 'raw', passes, value > low)) AS evidence_ms,
    countIf(if(mode = 'raw', passes, value > low)) AS shown
  FROM samples GROUP BY txn_id HAVING shown > 0
),
faulted AS (
  SELECT o.txn_id AS txn_id, min(f.impact_ms) AS impact_ms
  FROM (SELECT fault_id, argMax(node_id, recorded_at) AS node_id, argMax(device, recorded_at) AS device,
          argMax(layer, recorded_at) AS layer, argMax(source, recorded_at) AS source,
          toUnixTimestamp64Milli(argMax(impact_at, recorded_at)) AS impact_ms
        FROM {db}.faults GROUP BY fault_id) AS f
  INNER JOIN incidents AS o ON f.node_id = o.node_id
  WHERE f.source = 'confirmed' AND f.layer = o.layer
    AND (f.device = '' OR o.device = '' OR f.device = o.device)
    AND f.impact_ms <= o.first_ms AND f.impact_ms >= o.first_ms - {fault_reach:Int64}
  GROUP BY o.txn_id
),
acted AS (
  SELECT txn_id,
    minIf(finished_ms, action = {drain:String} AND latest = 'ok') AS drained_ms,
    minIf(finished_ms, action = {ticket:String} AND latest = 'ok') AS ticket_ms,
    max(action = {resume:String}) AS repaired,
    max(action = {needs_person:String}) AS needs_person,
    max(was_refused) AS refused,
    max(without_repair) AS without_repair
  FROM (
    SELECT txn_id, action, argMax(status, version) AS latest,
      toUnixTimestamp64Milli(tupleElement(argMax(tuple(finished_at), version), 1)) AS finished_ms,
      max(status = 'refused') AS was_refused,
      max(positionCaseInsensitive(action, {unrepaired:String}) > 0
        OR positionCaseInsensitive(detail, {unrepaired:String}) > 0) AS without_repair
    FROM {db}.actions WHERE txn_id IN (SELECT txn_id FROM incidents)
    GROUP BY txn_id, finding_id, action, target
  ) GROUP BY txn_id
),
measured AS (
  SELECT i.txn_id AS txn_id, i.layer AS layer,
    concat(toString(toISOYear(d)), '-W', leftPad(toString(toISOWeek(d)), 2, '0')) AS week,
    multiIf(s.txn_id = '' AND f.txn_id = '', NULL, s.txn_id = '', f.impact_ms, f.txn_id = '', s.evidence_ms,
      least(s.evidence_ms, f.impact_ms)) AS evidence_ms,
    (i.first_ms - evidence_ms) / 60000 AS mttd,
    if(a.drained_ms IS NULL, NULL, (a.drained_ms - i.first_ms) / 60000) AS isolation,
    if(a.ticket_ms IS NULL, NULL, (a.ticket_ms - i.first_ms) / 60000) AS ticket,
    if(i.l4, ticket, NULL) AS l4_ticket,
    a.repaired AS repaired, a.without_repair AS without_repair, a.needs_person AS needs_person,
    a.refused AS refused
  FROM (SELECT *, toDate(fromUnixTimestamp64Milli(first_ms, 'UTC')) AS d FROM incidents) AS i
  LEFT JOIN sampled AS s ON i.txn_id = s.txn_id
  LEFT JOIN faulted AS f ON i.txn_id = f.txn_id
  LEFT JOIN acted AS a ON i.txn_id = a.txn_id
)
SELECT week, layer, count() AS incidents,
  quantileExactInclusive(0.5)(mttd), quantileExactInclusive(0.9)(mttd), count(mttd),
  quantileExactInclusive(0.5)(isolation), quantileExactInclusive(0.9)(isolation), count(isolation),
  quantileExactInclusive(0.5)(ticket), quantileExactInclusive(0.9)(ticket), count(ticket),
  countIf(repaired = 1), countIf(without_repair = 1), countIf(needs_person = 1), countIf(refused = 1),
  quantileExactInclusive(0.5)(l4_ticket), quantileExactInclusive(0.9)(l4_ticket), count(l4_ticket)
FROM measured
GROUP BY GROUPING SETS ((week, layer), (week), ())
ORDER BY week = '', week, layer = '', layer
"""


def _minutes(value: Any) -> float | None:
    if value is None or not math.isfinite(float(value)):
        return None
    return round(float(value), 2)


def outcomes(store: Store, rules: list[Rule], catalog: Catalog, since_ms: int, until_ms: int) -> Outcomes:
    """The outcome numbers of the incidents that began in [since_ms, until_ms]."""
    table = _rule_columns(rules, catalog)
    longest = max((w for w, mode in zip(table["win"], table["mode"], strict=True) if mode), default=0)
    sql = _QUERY.replace("{db}", store.database).replace("{passes}", _PASSES)
    params = {
        **table,
        "since": since_ms,
        "until": until_ms,
        "other": OTHER,
        "reach": since_ms - max(longest, FAULT_REACH_MS),
        "fault_reach": FAULT_REACH_MS,
        "drain": DRAIN,
        "ticket": TICKET,
        "resume": RESUME,
        "needs_person": NEEDS_PERSON,
        "unrepaired": RESUMED_WITHOUT_REPAIR,
    }
    result = Outcomes(since_ms, until_ms)
    for row in store.query(sql, params):
        if not row[2]:
            continue  # the empty window's grand total
        mttd, isolation, ticket, l4_ticket = (
            Spread(_minutes(row[i]), _minutes(row[i + 1]), int(row[i + 2])) for i in (3, 6, 9, 16)
        )
        repairs, unrepaired, person, refused = (int(v) for v in row[12:16])
        result.rows.append(
            OutcomeRow(
                *(row[0] or ALL, row[1] or ALL, int(row[2]), mttd, isolation, ticket, l4_ticket),
                *(repairs, unrepaired, person, refused),
            )
        )
    return result
