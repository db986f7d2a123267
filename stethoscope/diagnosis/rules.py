"""Rule files (docs/design.md "Rules"): YAML, data only, loaded and validated with file:line for every error.

The seed format loads as it is: rule_id, description, severity, trigger: [{metric, operator, threshold,
window}], action: [...]. Beyond it: `when: {all: [...], any: [...]}` nesting, per-condition aggregate,
labels, device pattern and min_samples, `aggregate: any` with `min_matches` (any sample of the window
passes), has_bits `without_bits`, `level`, `confidence`, `cooldown` and `family` (rules whose
findings on one node and device share a transaction).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from stethoscope import timeutil
from stethoscope.aggregates import NAMES
from stethoscope.bounded_yaml import RULE_FILE_MAX_BYTES, BoundedSafeLoader, is_stdin, load_bounded
from stethoscope.catalog import AGGREGATES as KIND_AGGREGATES
from stethoscope.catalog import Catalog

if TYPE_CHECKING:  # jinja2 is loaded with the rules, not by every command that imports this module
    from jinja2.sandbox import SandboxedEnvironment

SEVERITIES = ("info", "warning", "critical")
LEVELS = ("L1", "L2", "L3", "L4")
OPERATORS = (">", ">=", "<", "<=", "==", "!=", "has_bits")
AGGREGATES = NAMES  # stethoscope/aggregates.py: the one registry
BASELINES = ("node", "fleet")
DEVIATIONS = ("percent", "sigma")
CORRELATE_BY = ("switch", "rack")
ACTION_FIELDS = {
    "log": ({"message"}, {"message", "level"}),
    "alert": ({"message"}, {"message", "endpoint", "channel"}),
    "api_call": ({"endpoint"}, {"endpoint", "method", "payload", "headers", "timeout", "retries"}),
    "playbook": ({"playbook"}, {"playbook", "extra_vars"}),
}
TEMPLATE_FIELDS = ("message", "endpoint", "payload")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
RULE_FIELDS = {
    "rule_id",
    "description",
    "severity",
    "level",
    "confidence",
    "cooldown",
    "family",
    "trigger",
    "when",
    "action",
    "correlate",
    "message",
}
CONDITION_FIELDS = {
    "metric",
    "operator",
    "threshold",
    "window",
    "aggregate",
    "labels",
    "device",
    "min_samples",
    "min_matches",
    "without_bits",
    "baseline",
    "deviation",
    "history",
}
# A window spans at least this many reports of its series (docs/design.md "Rules"): shorter windows
# stretch to it, at whatever cadence the inventory declares or the series shows.
REPORTS_PER_WINDOW = 3
# why `any` has no meaning on a counter or events metric: each sample is a running total
ANY_ON_TOTALS = (
    ": its samples are running totals, and delta counts every event in the window, however short its spell"
)
_RULE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
# relative, no '..': a rule cannot point a remediation at a playbook outside playbooks/
_PLAYBOOK = re.compile(r"^(?:[A-Za-z0-9_-]+/)*[A-Za-z0-9_-]+\.ya?ml$")


class LineDict(dict):
    """A YAML mapping that remembers where it and each of its keys stood."""

    line = 0
    key_lines: dict[str, int]


class _LineLoader(BoundedSafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
    mapping = LineDict(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {
        key.value: key.start_mark.line + 1 for key, _value in node.value if hasattr(key, "value")
    }
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


@dataclass(frozen=True)
class RuleError:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.message}"


@dataclass(frozen=True)
class Condition:
    metric: str
    operator: str
    threshold: float
    window_seconds: int
    aggregate: str = "avg"
    labels: tuple[tuple[str, str], ...] = ()
    device: str | None = None
    min_samples: int = 1
    baseline: str | None = None  # node | fleet: the value compared is the deviation from it
    deviation: str = "percent"  # percent | sigma, in the direction the catalog calls worse
    history_seconds: int = 30 * 86400  # how far back the node's own baseline reaches
    better: str = "none"
    kind: str = "gauge"  # the metric's kind in the catalog: gauge | counter | events
    # The cadence (docs/design.md "Rules"): the series' declared report interval, the window as
    # written (window_seconds is it stretched to REPORTS_PER_WINDOW reports where shorter), and
    # min_samples as a share of the reports the window was written for (0: any one sample will do);
    # `at_cadence` fits window_seconds and min_samples to the interval a series really shows.
    interval_seconds: int = 60
    written_window_seconds: int = 0
    min_share: float = 0.0
    cadence_seconds: int = 0  # the interval `at_cadence` fitted it to (0: the declared one)
    # `aggregate: any`: the samples that must pass the comparison on their own; has_bits: the bits a
    # sample must not have as well (HW slowdown without its thermal or power-brake bit)
    min_matches: int = 1
    without_bits: int = 0

    @property
    def stream(self) -> bool:
        return ("source", "stream") in self.labels

    def at_cadence(self, interval: int) -> Condition:
        """This condition for series reported every `interval` seconds (never faster than declared):
        the window spans at least REPORTS_PER_WINDOW reports, and the samples it asks for are its
        share of the reports the window then expects, one of them allowed to be late or lost."""
        interval = max(interval, self.interval_seconds)
        window = max(self.written_window_seconds or self.window_seconds, REPORTS_PER_WINDOW * interval)
        return replace(
            self,
            window_seconds=window,
            min_samples=required_samples(self.min_share, window, interval),
            cadence_seconds=interval,
        )


@dataclass(frozen=True)
class Group:
    mode: str  # all | any
    items: tuple[Condition | Group, ...]


@dataclass(frozen=True)
class Action:
    type: str
    params: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Rule:
    rule_id: str
    description: str
    severity: str
    when: Group
    actions: tuple[Action, ...]
    level: str | None = None
    confidence: float = 1.0
    cooldown_seconds: int = 3600
    file: str = ""
    line: int = 0
    correlate_by: str | None = None  # switch | rack: several nodes behind one are one finding
    correlate_min_nodes: int = 2
    message: str | None = None  # the finding's text (a template); default actions use it
    # rules of one family (an early-warning trend and its hard limit) share a finding's transaction
    family: str | None = None

    @property
    def conditions(self) -> list[Condition]:
        """Every condition of the rule, however its groups nest."""
        return conditions(self.when)

    @property
    def metrics(self) -> list[str]:
        """The metric of each condition, in the rule's order (the first is the rule's own)."""
        return [condition.metric for condition in self.conditions]


def conditions(item: Condition | Group) -> list[Condition]:
    if isinstance(item, Condition):
        return [item]
    return [found for child in item.items for found in conditions(child)]


@dataclass
class LoadResult:
    rules: list[Rule] = field(default_factory=list)
    errors: list[RuleError] = field(default_factory=list)
    files: int = 0
    notes: list[RuleError] = field(default_factory=list)  # not errors: windows stretched to the cadence


def required_samples(share: float, window: int, interval: int) -> int:
    """Samples a window of `window` seconds at one report every `interval` must hold: `share` of the
    reports it expects, but one of them, which a late or lost sweep takes away; at least 1."""
    expected = window / max(interval, 1)
    return max(1, math.ceil(round(share * (expected - 1), 6)))


def min_share(min_samples: int, window: int, authored_interval: int) -> float:
    """min_samples as written, as a share of the reports `window` expects at the catalog's interval
    (the cadence the rule's author counted on); 0 for the default of 1 sample."""
    if min_samples <= 1 or window <= 0:
        return 0.0
    return min(1.0, min_samples * authored_interval / window)


def fmt_duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def parse_duration(text: Any) -> int | None:
    """Whole seconds of a duration in timeutil's one syntax ('30s', '1.5h', '1w', '300'); None if it is
    not one, or not a whole number of seconds."""
    try:
        seconds = timeutil.parse_duration(text)
    except timeutil.DurationError:
        return None
    return int(seconds) if float(seconds).is_integer() else None


class _Validator:
    def __init__(self, path: Path, catalog: Catalog, sandbox: SandboxedEnvironment):
        self.file = str(path)
        self.catalog = catalog
        self.sandbox = sandbox
        self.errors: list[RuleError] = []
        self.notes: list[RuleError] = []

    def error(self, where: Any, key: str, message: str, fallback: int = 0) -> None:
        line = getattr(where, "key_lines", {}).get(key) or getattr(where, "line", 0) or fallback
        self.errors.append(RuleError(self.file, line, key, message))

    def rule(self, data: Any, fallback_line: int) -> Rule | None:
        before = len(self.errors)
        if not isinstance(data, dict):
            self.errors.append(RuleError(self.file, fallback_line, "rule", "expected a mapping"))
            return None
        for key in sorted(set(data) - RULE_FIELDS):
            self.error(data, key, f"unknown field (known: {', '.join(sorted(RULE_FIELDS))})")
        rule_id = data.get("rule_id")
        if not isinstance(rule_id, str) or not _RULE_ID.match(rule_id):
            self.error(data, "rule_id", f"required, letters, digits, '_', '.', '-' only; got {rule_id!r}")
        if not isinstance(data.get("description"), str) or not data["description"].strip():
            self.error(data, "description", "required text (say what the rule detects and its source)")
        if data.get("severity") not in SEVERITIES:
            self.error(data, "severity", f"one of {', '.join(SEVERITIES)}; got {data.get('severity')!r}")
        level = data.get("level")
        if level is not None and level not in LEVELS:
            self.error(data, "level", f"one of {', '.join(LEVELS)}; got {level!r}")
        confidence = data.get("confidence", 1.0)
        if isinstance(confidence, bool) or not isinstance(confidence, int | float) or not 0 < confidence <= 1:
            self.error(data, "confidence", f"a number in (0, 1]; got {confidence!r}")
        cooldown = parse_duration(data.get("cooldown", "1h"))
        if cooldown is None:
            self.error(data, "cooldown", f"a duration like 30m or 1h; got {data.get('cooldown')!r}")
        items: list[Condition | Group] = []
        if "trigger" in data:
            trigger = data["trigger"]
            if not isinstance(trigger, list) or not trigger:
                self.error(data, "trigger", "a non-empty list of conditions (all must hold)")
            else:
                items.append(self.group("all", trigger, data, "trigger"))
        if "when" in data:
            items.append(self.when(data["when"], data))
        if not items:
            self.error(data, "trigger", "a rule needs `trigger` or `when`")
        actions = self.actions(data.get("action", []), data)
        correlate = self.correlate(data.get("correlate"), data)
        message = data.get("message")
        if message is not None:
            self.template(data, "message", message)
        family = data.get("family")
        if family is not None and (not isinstance(family, str) or not _RULE_ID.match(family)):
            self.error(data, "family", f"a name: letters, digits, '_', '.', '-' only; got {family!r}")
        if len(self.errors) > before:
            return None
        when = items[0] if len(items) == 1 and isinstance(items[0], Group) else Group("all", tuple(items))
        return Rule(
            str(rule_id),
            data["description"].strip(),
            data["severity"],
            when,
            actions,  # type: ignore[arg-type]
            level,
            float(confidence),
            cooldown or 3600,
            self.file,
            getattr(data, "line", fallback_line),
            *correlate,
            message,
            family,
        )

    def template(self, where: Any, key: str, text: Any) -> None:
        if not isinstance(text, str):
            self.error(where, key, f"a template string; got {text!r}")
            return
        from jinja2 import TemplateSyntaxError

        try:
            self.sandbox.parse(text)
        except TemplateSyntaxError as exc:
            self.error(where, key, f"template syntax error: {exc.message}")

    def correlate(self, data: Any, parent: Any) -> tuple[str | None, int]:
        if data is None:
            return None, 2
        if (
            not isinstance(data, dict)
            or data.get("by") not in CORRELATE_BY
            or set(data) - {"by", "min_nodes"}
        ):
            self.error(parent, "correlate", f"{{by: {' | '.join(CORRELATE_BY)}, min_nodes: N}}; got {data!r}")
            return None, 2
        min_nodes = data.get("min_nodes", 2)
        if isinstance(min_nodes, bool) or not isinstance(min_nodes, int) or min_nodes < 2:
            self.error(data, "min_nodes", f"an integer >= 2; got {min_nodes!r}")
            return None, 2
        return data["by"], min_nodes

    def when(self, node: Any, parent: Any) -> Group:
        if not isinstance(node, dict) or not node or set(node) - {"all", "any"}:
            self.error(parent, "when", "a mapping with `all` and/or `any` lists")
            return Group("all", ())
        groups = [self.group(mode, node[mode], node, mode) for mode in ("all", "any") if mode in node]
        return groups[0] if len(groups) == 1 else Group("all", tuple(groups))

    def group(self, mode: str, items: Any, parent: Any, key: str) -> Group:
        if not isinstance(items, list) or not items:
            self.error(parent, key, "a non-empty list")
            return Group(mode, ())
        parsed: list[Condition | Group] = []
        for item in items:
            if isinstance(item, dict) and set(item) and set(item) <= {"all", "any"}:
                parsed.append(self.when(item, parent))
            else:
                condition = self.condition(item, parent, key)
                if condition is not None:
                    parsed.append(condition)
        return Group(mode, tuple(parsed))

    def condition(self, data: Any, parent: Any, key: str) -> Condition | None:
        if not isinstance(data, dict):
            self.error(parent, key, f"each condition is a mapping; got {data!r}")
            return None
        before = len(self.errors)
        for unknown in sorted(set(data) - CONDITION_FIELDS):
            self.error(
                data, unknown, f"unknown condition field (known: {', '.join(sorted(CONDITION_FIELDS))})"
            )
        metric = data.get("metric")
        spec = self.catalog.get(metric) if isinstance(metric, str) else None
        if spec is None:
            self.error(data, "metric", f"unknown metric {metric!r}: not in rules/metrics.yml")
        operator = data.get("operator")
        if operator not in OPERATORS:
            self.error(data, "operator", f"one of {' '.join(OPERATORS)}; got {operator!r}")
        threshold = data.get("threshold")
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            self.error(data, "threshold", f"a number; got {threshold!r}")
        elif operator == "has_bits" and (not float(threshold).is_integer() or threshold <= 0):
            self.error(data, "threshold", f"has_bits needs a positive integer bitmask; got {threshold!r}")
        window = parse_duration(data.get("window"))
        if window is None:
            self.error(data, "window", f"a duration like 5m; got {data.get('window')!r}")
        labels = data.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str | int | float) for v in labels.values()):
            self.error(data, "labels", "a mapping of label name to value")
            labels = {}
        stream = str(labels.get("source", "")) == "stream"
        interval = self.catalog.interval_of(str(metric), stream) if spec is not None else 60
        reach = REPORTS_PER_WINDOW * interval
        if window is not None and spec is not None and window < reach:
            self.notes.append(
                RuleError(
                    self.file,
                    getattr(data, "key_lines", {}).get("window") or getattr(data, "line", 0) or 0,
                    "window",
                    f"note: {fmt_duration(window)} is shorter than {REPORTS_PER_WINDOW} reports of "
                    f"{metric} {'from the stream ' if stream else ''}at {interval} s: it reads "
                    f"{fmt_duration(reach)} ({REPORTS_PER_WINDOW} x {interval} s)",
                )
            )
        kind = spec.kind if spec else "gauge"
        allowed = KIND_AGGREGATES[kind]
        aggregate = data.get("aggregate", allowed[0])
        if aggregate not in AGGREGATES:
            self.error(data, "aggregate", f"one of {', '.join(AGGREGATES)}; got {aggregate!r}")
        elif spec is not None and aggregate not in allowed:
            why = ANY_ON_TOTALS if aggregate == "any" else ""
            self.error(
                data,
                "aggregate",
                f"{aggregate} does not apply to {metric}, a {kind}{why} "
                f"(a {kind} allows {', '.join(allowed)})",
            )
        min_samples = data.get("min_samples", 1)
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1:
            self.error(data, "min_samples", f"a positive integer; got {min_samples!r}")
        min_matches = self.min_matches(data, aggregate)
        without_bits = self.without_bits(data, operator, threshold)
        device = data.get("device")
        if device is not None and not isinstance(device, str):
            self.error(data, "device", f"a device name or pattern like gpu* or mlx5_*/1; got {device!r}")
        baseline = data.get("baseline")
        if baseline is not None and baseline not in BASELINES:
            self.error(data, "baseline", f"one of {', '.join(BASELINES)}; got {baseline!r}")
        deviation = data.get("deviation", "percent")
        if deviation not in DEVIATIONS:
            self.error(data, "deviation", f"one of {', '.join(DEVIATIONS)}; got {deviation!r}")
        history = parse_duration(data.get("history", "30d"))
        if history is None:
            self.error(data, "history", f"a duration like 30d; got {data.get('history')!r}")
        if baseline is None and ("deviation" in data or "history" in data):
            self.error(data, "baseline", "deviation and history need `baseline: node` or `baseline: fleet`")
        if baseline is not None and kind != "gauge":
            self.error(data, "baseline", f"a baseline deviation applies to a gauge; {metric} is a {kind}")
        if baseline == "fleet" and "history" in data:
            self.error(
                data, "history", "a fleet baseline compares nodes within the window; history is for node"
            )
        if baseline is not None and aggregate == "any":
            self.error(
                data,
                "aggregate",
                "any compares each sample with the threshold; a baseline compares the window's aggregate "
                "with its baseline: use one or the other",
            )
        if len(self.errors) > before:
            return None
        share = min_share(
            min_samples, int(window or 0), self.catalog.authored_interval_of(str(metric), stream)
        )
        return Condition(
            str(metric),
            str(operator),
            float(threshold),  # type: ignore[arg-type]  # checked above: a number
            int(window or 0),
            aggregate,  # type: ignore[arg-type]
            tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            device,
            min_samples,
            baseline,
            deviation,
            history or 30 * 86400,
            spec.better if spec else "none",
            kind,
            interval,
            int(window or 0),
            share,
            min_matches=min_matches,
            without_bits=without_bits,
        ).at_cadence(interval)

    def min_matches(self, data: Any, aggregate: Any) -> int:
        if "min_matches" not in data:
            return 1
        min_matches = data["min_matches"]
        if isinstance(min_matches, bool) or not isinstance(min_matches, int) or min_matches < 1:
            self.error(data, "min_matches", f"a positive integer; got {min_matches!r}")
            return 1
        if aggregate != "any":
            self.error(
                data, "min_matches", "counts the samples that pass on their own: it needs `aggregate: any`"
            )
        return min_matches

    def without_bits(self, data: Any, operator: Any, threshold: Any) -> int:
        if "without_bits" not in data:
            return 0
        mask = data["without_bits"]
        if operator != "has_bits":
            self.error(
                data, "without_bits", "bits a matching sample must not have: it needs `operator: has_bits`"
            )
        elif isinstance(mask, bool) or not isinstance(mask, int) or mask <= 0:
            self.error(data, "without_bits", f"a positive integer bitmask; got {mask!r}")
        elif isinstance(threshold, int | float) and int(threshold) & mask:
            self.error(data, "without_bits", f"{mask} shares bits with the threshold {threshold}")
        else:
            return mask
        return 0

    def actions(self, items: Any, parent: Any) -> tuple[Action, ...]:
        if items in (None, []):
            return ()
        if not isinstance(items, list):
            self.error(parent, "action", "a list of actions")
            return ()
        actions = []
        for item in items:
            if not isinstance(item, dict):
                self.error(parent, "action", f"each action is a mapping; got {item!r}")
                continue
            kind = item.get("type")
            if kind not in ACTION_FIELDS:
                self.error(item, "type", f"unknown action type {kind!r} (known: {', '.join(ACTION_FIELDS)})")
                continue
            required, allowed = ACTION_FIELDS[kind]
            for missing in sorted(required - set(item)):
                self.error(item, missing, f"required for a {kind} action")
            for unknown in sorted(set(item) - allowed - {"type"}):
                self.error(
                    item, unknown, f"not a field of a {kind} action (known: {', '.join(sorted(allowed))})"
                )
            if kind == "playbook" and not _PLAYBOOK.match(str(item.get("playbook", ""))):
                self.error(
                    item,
                    "playbook",
                    f"a playbook under playbooks/, like remediate/drain.yml; got {item.get('playbook')!r}",
                )
            if kind == "api_call" and str(item.get("method", "POST")).upper() not in HTTP_METHODS:
                self.error(item, "method", f"one of {', '.join(HTTP_METHODS)}; got {item.get('method')!r}")
            for key in TEMPLATE_FIELDS:
                if isinstance(item.get(key), str):
                    self.template(item, key, item[key])
            actions.append(Action(kind, tuple(sorted((k, v) for k, v in item.items() if k != "type"))))
        return tuple(actions)


def rule_files(path: Path) -> list[Path]:
    if path.is_file() or is_stdin(path):
        return [path]
    # the catalog, the stream's metric sets and the exporters' names (rules/sources): data, not rules
    data = ("metrics.yml", "telemetry.yml", "exporters.yml")
    return sorted(p for p in path.rglob("*") if p.suffix in (".yml", ".yaml") and p.name not in data)


def load_rules(path: str | Path, catalog: Catalog) -> LoadResult:
    """Every rule under `path` (a file or a folder, metrics.yml excepted), and every problem found."""
    from jinja2.sandbox import SandboxedEnvironment

    result = LoadResult()
    sandbox = SandboxedEnvironment()
    seen: dict[str, str] = {}
    for file in rule_files(Path(path)):
        result.files += 1
        validator = _Validator(file, catalog, sandbox)
        try:
            data = load_bounded(file, RULE_FILE_MAX_BYTES, "rule file", _LineLoader)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            result.errors.append(
                RuleError(str(file), mark.line + 1 if mark else 1, "yaml", str(exc).splitlines()[0])
            )
            continue
        except OSError as exc:
            result.errors.append(RuleError(str(file), 1, "file", str(exc)))
            continue
        documents = data.get("rules") if isinstance(data, dict) and "rules" in data else data
        documents = documents if isinstance(documents, list) else [documents]
        for document in documents:
            rule = validator.rule(document, getattr(data, "line", 1))
            if rule is None:
                continue
            if rule.rule_id in seen:
                validator.errors.append(
                    RuleError(
                        str(file),
                        rule.line,
                        "rule_id",
                        f"{rule.rule_id!r} is already defined in {seen[rule.rule_id]}",
                    )
                )
                continue
            seen[rule.rule_id] = f"{file}:{rule.line}"
            result.rules.append(rule)
        result.errors.extend(validator.errors)
        result.notes.extend(validator.notes)
    return result
