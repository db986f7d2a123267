"""Is there fresh data behind a rule's silence? A finding that stops matching is resolved only when the
rule's metrics have samples for its node inside their windows at the evaluation time; otherwise the
data stopped, and the finding is stale, not healthy (docs/design.md "Rules", the life of a finding)."""

from __future__ import annotations

from stethoscope.diagnosis.rules import Condition, Group, Rule
from stethoscope.store.client import Store


def _conditions(group: Group) -> list[Condition]:
    found: list[Condition] = []
    for item in group.items:
        found += _conditions(item) if isinstance(item, Group) else [item]
    return found


def _holds(group: Group, fresh: dict[Condition, set[str]], node: str) -> bool:
    results = (
        _holds(item, fresh, node) if isinstance(item, Group) else node in fresh[item] for item in group.items
    )
    return all(results) if group.mode == "all" else any(results)


def fresh_nodes(store: Store, rule: Rule, nodes: set[str], at_ms: int) -> set[str]:
    """Those of `nodes` whose data the rule reads is fresh at `at_ms` (an `any` group needs one branch)."""
    if not nodes:
        return set()
    fresh: dict[Condition, set[str]] = {}
    for condition in _conditions(rule.when):
        table = "bench_results" if condition.metric.startswith("bench_") else "metrics"
        rows = store.query(
            f"SELECT DISTINCT node_id FROM {store.database}.{table} "
            "WHERE metric_name = {metric:String} AND node_id IN {nodes:Array(String)} "
            "AND timestamp <= fromUnixTimestamp64Milli({at:Int64}, 'UTC') "
            "AND timestamp > fromUnixTimestamp64Milli({at:Int64}, 'UTC') - toIntervalSecond({w:UInt32})",
            {"metric": condition.metric, "nodes": sorted(nodes), "at": at_ms, "w": condition.window_seconds},
        )
        fresh[condition] = {row[0] for row in rows}
    return {node for node in nodes if _holds(rule.when, fresh, node)}
