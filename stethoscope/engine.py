"""Rule evaluation in ClickHouse: one query per rule over all nodes (DESIGN.md "Rules").

A condition becomes a subquery that aggregates a metric per node and device over its window and keeps
the rows past the threshold; `all` joins its members on the node (and on the enclosing device where
every member names the same kind of device: gpu2/link3 belongs to gpu2), `any` unions them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stethoscope.rules import Condition, Group, Rule
from stethoscope.store import Store

# The kind of device a metric is reported on; conditions of one kind join on the enclosing device.
DEVICE_KINDS = (
    ("nvlink_", "gpu"),
    ("gpu_", "gpu"),
    ("pcie_", "pci"),
    ("ib_", "hca"),
    ("rdma_", "hca"),
    ("smart_", "disk"),
    ("nvme_", "disk"),
    ("disk_", "disk"),
    ("bench_", "bench"),
)
_OPERATORS = {">": ">", ">=": ">=", "<": "<", "<=": "<=", "==": "=", "!=": "!="}


def device_kind(metric: str) -> str:
    for prefix, kind in DEVICE_KINDS:
        if metric.startswith(prefix):
            return kind
    return "node"


@dataclass
class Match:
    node_id: str
    device: str
    value: float
    values: dict[str, float] = field(default_factory=dict)


class _Builder:
    """Builds the SQL of one rule; values travel as query parameters, never spliced in."""

    def __init__(self, database: str, at_ms: int):
        self.database = database
        self.params: dict[str, Any] = {"at": at_ms}
        self.count = 0

    def param(self, value: Any, kind: str) -> str:
        self.count += 1
        name = f"p{self.count}"
        self.params[name] = value
        return f"{{{name}:{kind}}}"

    def aggregate(self, condition: Condition) -> str:
        series = "arrayMap(t -> t.2, arraySort(groupArray((timestamp, value))))"
        # increases between consecutive samples; a counter reset (a drop) counts its new value
        steps = f"arrayPopBack({series}), arrayPopFront({series})"
        increase = f"arraySum(arrayMap((a, b) -> if(b >= a, b - a, b), {steps}))"
        return {
            "avg": "avg(value)",
            "max": "max(value)",
            "min": "min(value)",
            "last": "argMax(value, timestamp)",
            "p99": "quantile(0.99)(value)",
            "stddev": "stddevSamp(value)",
            "cv": "if(avg(value) = 0, 0, stddevSamp(value) / abs(avg(value)))",
            "delta": increase,
            "rate": f"{increase} / {self.param(condition.window_seconds, 'UInt32')}",
        }[condition.aggregate]

    def comparison(self, condition: Condition) -> str:
        if condition.operator == "has_bits":
            return f"bitAnd(toUInt64(v), {self.param(int(condition.threshold), 'UInt64')}) != 0"
        return f"v {_OPERATORS[condition.operator]} {self.param(condition.threshold, 'Float64')}"

    def leaf(self, condition: Condition, by_device: bool) -> str:
        where = [
            f"metric_name = {self.param(condition.metric, 'String')}",
            "timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC')",
            "timestamp > fromUnixTimestamp64Milli({at:Int64}, 'UTC') - "
            f"toIntervalSecond({self.param(condition.window_seconds, 'UInt32')})",
        ]
        for key, value in condition.labels:
            where.append(f"labels[{self.param(key, 'String')}] = {self.param(value, 'String')}")
        if condition.device:
            pattern = (
                "^"
                + "".join(".*" if c == "*" else "\\" + c if not c.isalnum() else c for c in condition.device)
                + "$"
            )
            where.append(f"match(device, {self.param(pattern, 'String')})")
        key = "splitByChar('/', device)[1]" if by_device else "''"
        return (
            f"SELECT node_id, {key} AS key, any(device) AS dev, "
            f"map({self.param(condition.metric, 'String')}, v) AS values, v "
            f"FROM (SELECT node_id, device, {self.aggregate(condition)} AS v, count() AS n "
            f"FROM {self.database}.metrics WHERE {' AND '.join(where)} GROUP BY node_id, device "
            f"HAVING n >= {self.param(condition.min_samples, 'UInt32')} AND {self.comparison(condition)}) "
            f"GROUP BY node_id, key, v"
        )

    def group(self, group: Group, by_device: bool) -> str:
        parts = [self.node(item, by_device) for item in group.items]
        if len(parts) == 1:
            return parts[0]
        if group.mode == "any":
            union = " UNION ALL ".join(f"({part})" for part in parts)
            return (
                f"SELECT node_id, key, any(dev) AS dev, maxMap(values) AS values, any(v) AS v "
                f"FROM ({union}) GROUP BY node_id, key"
            )
        query = f"({parts[0]}) AS t0"
        for index, part in enumerate(parts[1:], start=1):
            on = f"t0.node_id = t{index}.node_id AND t0.key = t{index}.key"
            query += f" INNER JOIN ({part}) AS t{index} ON {on}"
        values = "mapConcat(" + ", ".join(f"t{i}.values" for i in range(len(parts))) + ")"
        columns = f"t0.node_id AS node_id, t0.key AS key, t0.dev AS dev, {values} AS values, t0.v AS v"
        return f"SELECT {columns} FROM {query}"

    def node(self, item: Condition | Group, by_device: bool) -> str:
        return self.leaf(item, by_device) if isinstance(item, Condition) else self.group(item, by_device)


def _metrics(item: Condition | Group) -> list[str]:
    if isinstance(item, Condition):
        return [item.metric]
    return [metric for child in item.items for metric in _metrics(child)]


def rule_query(rule: Rule, database: str, at_ms: int) -> tuple[str, dict[str, Any]]:
    """The one query that evaluates `rule` over every node at `at_ms`."""
    kinds = {device_kind(metric) for metric in _metrics(rule.when)}
    by_device = len(kinds) == 1 and kinds != {"node"}
    builder = _Builder(database, at_ms)
    body = builder.node(rule.when, by_device)
    # one match per node (and enclosing device): the first condition's value, every condition's values
    sql = (
        f"SELECT node_id, any(dev) AS device, any(v) AS value, maxMap(values) AS all_values FROM ({body}) "
        f"GROUP BY node_id, key ORDER BY node_id, device"
    )
    return sql, builder.params


def evaluate(store: Store, rule: Rule, at_ms: int) -> list[Match]:
    sql, params = rule_query(rule, store.database, at_ms)
    rows = store.query(sql, params)
    return [Match(node, device, float(value), dict(values)) for node, device, value, values in rows]
