"""Plain rules read a window at a time: a cycle reads, for each window its plain rules use, every
metric they name in one query (engine.QueryBuilder.window_read: each series' aggregates over the
window's raw rows, each timestamp once), and judges those rules here, in Python, as the rule's own
query would (engine.QueryBuilder.leaf, group, rule_query): the series a condition's labels and
device select, with enough samples, past its comparison; the worst of a node (or of its enclosing
device) speaking for it; `all` joining them on that key, `any` merging them.

A plain rule is one with no correlation whose every condition, with no baseline, on a metric
that is no benchmark's, with a device glob in ASCII, aggregates the metric's raw rows over a window
inside the raw TTL (an aggregate of aggregates.py's registry, not `any`), or is an increase read
with whole hours from metrics_hourly (engine.QueryBuilder.hourly_increase, the window's read of
increases the same query for several metrics). The others, and a plain rule whose read failed or
whose aggregate is not a number (NaN: its order is ClickHouse's to tell), are read by their own
query.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from stethoscope.aggregates import INCREASES
from stethoscope.diagnosis.rules import Condition, Group, Rule, conditions
from stethoscope.diagnosis.shared_reads import LOWER_IS_WORSE, device_regex

Key = tuple[str, str]  # (node, the enclosing device's name or the device's own)
Judged = dict[Key, tuple[str, dict[str, float], float]]  # key -> (device, values, value)
KeyOf = Callable[[str], str]  # a device's name -> its key's second part
RE2_LIKE = re.ASCII | re.DOTALL
_COMPARED = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


@dataclass(frozen=True)
class Series:
    """One series' aggregates over a window, as the window's read returns it."""

    node_id: str
    device: str
    labels: Mapping[str, str]
    samples: int
    values: Mapping[str, float]  # aggregate name -> its value over the window
    bits: Mapping[str, int]  # aggregate name -> its value as a bitmask (has_bits conditions)


SeriesByMetric = Mapping[str, Sequence[Series]]
ReadKey = tuple[int, bool]  # a window's read: its seconds, and whether of increases


def read_key(condition: Condition) -> ReadKey:
    """The window's read that answers for `condition`."""
    return (condition.window_seconds, condition.aggregate in INCREASES)


class NotJudged(Exception):
    """The rule cannot be judged here (an aggregate that is not a number): read it by its query."""


def plain(condition: Condition, raw_ttl_seconds: int, hourly_increase: Callable[[Condition], bool]) -> bool:
    """Whether a window's read answers for `condition`; an increase where it is read with whole hours
    from metrics_hourly (`hourly_increase`: engine.QueryBuilder.hourly_reads)."""
    if condition.baseline is not None or condition.metric.startswith("bench_"):
        return False
    if condition.device is not None and not condition.device.isascii():
        return False  # ClickHouse's RE2 refuses an escaped non-ASCII character that Python's re takes
    if condition.aggregate in INCREASES:
        return hourly_increase(condition)
    return condition.aggregate != "any" and condition.window_seconds <= raw_ttl_seconds


def plain_rule(rule: Rule, raw_ttl_seconds: int, hourly_increase: Callable[[Condition], bool]) -> bool:
    return not rule.correlate_by and all(
        plain(c, raw_ttl_seconds, hourly_increase) for c in conditions(rule.when)
    )


@dataclass(frozen=True)
class WindowRead:
    """What one window's read takes: the metrics, the aggregates, and those wanted as bits too; the
    increases (delta, rate) of a window are read apart from its other aggregates."""

    window_seconds: int
    metrics: tuple[str, ...]
    aggregates: tuple[str, ...]
    bits: tuple[str, ...]
    increases: bool = False
    events: tuple[str, ...] = ()  # of the metrics, those of kind events (their first event is news)
    conditions: tuple[Condition, ...] = ()  # those it answers for: a series passing none is not read

    def increase(self) -> Condition:
        """The condition an increase's read is built for: the window's, of every metric it reads."""
        return Condition("", ">", 0.0, self.window_seconds, aggregate="delta", kind="counter")


def window_reads(rules: Iterable[Rule]) -> list[WindowRead]:
    """The reads the plain `rules` need, one per window (increases apart), the longest first."""
    wanted: dict[ReadKey, tuple[set[str], set[str], set[str], set[str]]] = {}
    tests: dict[ReadKey, dict[tuple, Condition]] = {}
    for rule in rules:
        for condition in conditions(rule.when):
            key = read_key(condition)
            metrics, aggregates, bits, events = wanted.setdefault(key, (set(), set(), set(), set()))
            test = (condition.metric, condition.aggregate, condition.min_samples, condition.operator)
            tests.setdefault(key, {}).setdefault(
                (*test, condition.threshold, condition.without_bits), condition
            )
            metrics.add(condition.metric)
            aggregates.add(condition.aggregate)
            if condition.operator == "has_bits":
                bits.add(condition.aggregate)
            if condition.kind == "events":
                events.add(condition.metric)
    return [
        WindowRead(
            window, _sorted(m), _sorted(a), _sorted(b), increases, _sorted(e), tuple(tests[key].values())
        )
        for key, (m, a, b, e) in sorted(wanted.items(), reverse=True)
        for window, increases in [key]
    ]


def _sorted(names: set[str]) -> tuple[str, ...]:
    return tuple(sorted(names))


_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'", re.DOTALL)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
_UNESCAPED = {"n": "\n", "t": "\t", "b": "\b", "r": "\r", "f": "\f", "0": "\0"}


@functools.lru_cache(maxsize=4096)
def labels_of(labels_key: str) -> Mapping[str, str]:
    """The labels a series' labels_key (`toString(mapSort(labels))`: `{'k':'v',...}`, each string
    quoted and backslash-escaped) writes."""
    if labels_key == "{}":
        return {}
    text = [
        _ESCAPED.sub(lambda m: _UNESCAPED.get(m.group(1), m.group(1)), quoted)
        for quoted in _QUOTED.findall(labels_key)
    ]
    return dict(zip(text[::2], text[1::2], strict=True))


def judge(
    rule: Rule, read: Mapping[ReadKey, SeriesByMetric], enclosing: str | None
) -> list[tuple[str, str, float, dict[str, float]]]:
    """(node, device, value, values) of each match of `rule`, by node and device, from the series of
    its windows' reads (`read`: read_key -> metric -> series); `enclosing`: the pattern of the device kind
    enclosing every metric of the rule, or None (one match per node)."""
    key_of = _enclosing_key(enclosing)
    judged = _node(rule.when, read, key_of)
    found = [(node, device, value, values) for (node, _), (device, values, value) in judged.items()]
    return sorted(found, key=lambda match: (match[0], match[1]))


def _enclosing_key(enclosing: str | None) -> KeyOf:
    if enclosing is None:
        return lambda device: ""
    pattern = re.compile(f"({enclosing})", RE2_LIKE)
    return lambda device: ((m := pattern.match(device)) and m.group(1)) or device


def _node(item: Condition | Group, read: Mapping[ReadKey, SeriesByMetric], key_of: KeyOf) -> Judged:
    if isinstance(item, Condition):
        return _leaf(item, read[read_key(item)].get(item.metric, ()), key_of)
    parts = [_node(child, read, key_of) for child in item.items]
    if len(parts) == 1:
        return parts[0]
    if item.mode == "any":  # as QueryBuilder.group: min(dev), maxMap(values), max(v)
        merged: Judged = {}
        for part in parts:
            for key, (device, values, value) in part.items():
                if key not in merged:
                    merged[key] = (device, dict(values), value)
                    continue
                kept_device, kept_values, kept_value = merged[key]
                for metric, metric_value in values.items():
                    kept_values[metric] = max(kept_values.get(metric, metric_value), metric_value)
                merged[key] = (min(kept_device, device), kept_values, max(kept_value, value))
        return merged
    # all: the keys every part has; the first part's device and value, the values of all (mapConcat
    # keeps a metric two parts name twice, and the rule's maxMap keeps the larger)
    keys = set(parts[0]).intersection(*parts[1:])
    joined: Judged = {}
    for key in keys:
        concatenated: dict[str, float] = {}
        for part in parts:
            for metric, metric_value in part[key][1].items():
                concatenated[metric] = max(concatenated.get(metric, metric_value), metric_value)
        joined[key] = (parts[0][key][0], concatenated, parts[0][key][2])
    return joined


def _leaf(condition: Condition, series: Iterable[Series], key_of: KeyOf) -> Judged:
    lower = condition.operator in LOWER_IS_WORSE
    # as RE2 reads it: `.` matches a newline, `\d` an ASCII digit, `$` only the very end
    device_pattern = re.compile(device_regex(condition.device), RE2_LIKE) if condition.device else None
    worst: dict[Key, tuple[float, str]] = {}
    for one in series:
        if any(one.labels.get(key, "") != value for key, value in condition.labels):
            continue
        if device_pattern is not None and not device_pattern.fullmatch(one.device):
            continue
        if one.samples < condition.min_samples:
            continue
        x = one.values[condition.aggregate]
        if not _passes(condition, x, one.bits.get(condition.aggregate, 0)):
            continue
        if math.isnan(x):  # passes `!=`, as in ClickHouse; which device is worst is ClickHouse's to tell
            raise NotJudged(f"{condition.metric}: {condition.aggregate} is not a number on {one.node_id}")
        key = (one.node_id, key_of(one.device))
        candidate = (x, one.device)
        kept = worst.get(key)
        if kept is None or (candidate < kept if lower else candidate > kept):
            worst[key] = candidate
    return {key: (device, {condition.metric: x}, x) for key, (x, device) in worst.items()}


def _passes(condition: Condition, x: float, bits: int) -> bool:
    if condition.operator == "has_bits":
        if condition.without_bits and bits & condition.without_bits:
            return False
        return bool(bits & int(condition.threshold))
    return _COMPARED[condition.operator](x, condition.threshold)
