"""A finding whose evidence comes from the stream alone (a stream rule's, the model's) is capped at L3:
no drain, unless a sweep or a benchmark confirms it, or the inventory allows stream-only isolation
(`stethoscope_stream_isolation: true`; docs/design.md "Remediation safety")."""

from __future__ import annotations

from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.levels import LEVEL_ACTIONS, action_label
from stethoscope.diagnosis.rules import Rule
from stethoscope.telemetry.metric_set import MetricSet

STREAM_LEVEL_CAP = "L3"


def stream_only_metrics(sets: dict[int, MetricSet], catalog: Catalog) -> set[str]:
    """Names only the stream reports: in a metric set and declared at the stream's cadence."""
    names = {slot.metric for s in sets.values() for slots in s.parts.values() for slot in slots}
    return {name for name in names if (spec := catalog.get(name)) is not None and spec.streamed}


def is_stream_only(rule: Rule, stream_names: set[str]) -> bool:
    conditions = rule.conditions
    return bool(conditions) and all(c.metric in stream_names or c.stream for c in conditions)


def cap_stream_only(findings: list[dict[str, Any]], rules: list[Rule], stream_names: set[str]) -> None:
    """Lower every stream-only L4 finding to L3, its drain taken out of its plan."""
    stream_rules = {r.rule_id for r in rules if is_stream_only(r, stream_names)}
    for finding in findings:
        from_stream = finding["rule_id"] in stream_rules or finding["rule_id"].startswith("model.")
        if not from_stream or finding["level"] != "L4":
            continue
        finding["level"] = STREAM_LEVEL_CAP
        plan = [a for a in finding["plan"] if "drain" not in str(dict(a.params).get("playbook", ""))]
        finding["plan"] = plan or list(LEVEL_ACTIONS[STREAM_LEVEL_CAP])
        finding["actions"] = [action_label(a) for a in finding["plan"]]
