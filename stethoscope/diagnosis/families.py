"""Rules read in one pass: single-condition rules that aggregate the same metric the same way over the
same window and differ only in labels, operator and threshold (the 21 XID rules: `delta` of
gpu_xid_errors_total over 15 minutes, one per `xid` label) form a family whose series are read and
aggregated once; each member then keeps the series its labels name that pass its own comparison.

The family's query is the members' shared aggregate per series (engine.QueryBuilder.measured, read
with the union of their label filters), each series' labels looked up by its `labels_key` in the
daily rollup (the days of the window: a series with samples there has a row there), and one row per
member, node and enclosing device that passes: `r` the member's place in the family, the device and
value of its worst series each way (as a member's operator reads worst).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from stethoscope.diagnosis.rules import Condition, Group, Rule

if TYPE_CHECKING:
    from stethoscope.diagnosis.engine import QueryBuilder

# what members of one family share: everything a series' aggregate depends on
FamilyKey = tuple[str, str, int, str | None, str, int]
LOWER_IS_WORSE = ("<", "<=")


def sole_condition(rule: Rule) -> Condition | None:
    """The rule's one condition, where it has only one (alone in its group)."""
    when: Condition | Group = rule.when
    while isinstance(when, Group) and len(when.items) == 1:
        when = when.items[0]
    return when if isinstance(when, Condition) else None


def family_key(rule: Rule) -> FamilyKey | None:
    """What the rule's read shares with its family's, or None for a rule read on its own: more than
    one condition, a correlated finding, a baseline, `any` (its comparison is part of the aggregate),
    a benchmark metric."""
    condition = sole_condition(rule)
    if (
        condition is None
        or rule.correlate_by
        or condition.baseline is not None
        or condition.aggregate == "any"
        or condition.metric.startswith("bench_")
    ):
        return None
    return (
        condition.metric,
        condition.aggregate,
        condition.window_seconds,
        condition.device,
        condition.kind,
        condition.min_samples,
    )


def units(rules: Sequence[Rule]) -> list[list[Rule]]:
    """`rules` as the reads a cycle makes, in their order: the members of each family together, every
    other rule alone."""
    grouped: dict[FamilyKey | int, list[Rule]] = {}
    for index, rule in enumerate(rules):
        key = family_key(rule)
        grouped.setdefault(index if key is None else key, []).append(rule)
    return list(grouped.values())


def family_sql(builder: QueryBuilder, members: Sequence[Condition], enclosing: str | None) -> str:
    """Rows (r, node_id, key, dev_high, high, dev_low, low) per member r (1-based), node and enclosing
    device: the worst passing series each way; and a row of r = 0 for a series whose labels were not
    found (the caller then reads each member on its own). `builder` reads with the members' label
    filters joined by OR; the labels of a series come from its raw rows in the window, the rows its
    aggregate reads (a family past the raw TTL is not read together)."""
    shared = replace(members[0], labels=())  # each member's labels apply after the shared read
    start, end = builder.window(shared)
    if enclosing is None:
        key = "''"
    else:
        pattern = builder.param(f"^({enclosing})", "String")
        key = f"if(extract(device, {pattern}) = '', device, extract(device, {pattern}))"
    enough = f"n >= {builder.param(shared.min_samples, 'UInt32')}"
    labelled = any(member.labels for member in members)
    passing = ["if(l.found = 0, [0], [])"] if labelled else []
    for place, member in enumerate(members, start=1):
        tests = [enough, builder.comparison(member)]
        if member.labels:
            tests.append(builder.labelled(member.labels, "l.series_labels"))
        passing.append(f"if({' AND '.join(tests)}, [{place}], [])")
    series = f"({builder.measured(shared)}) AS m"
    if labelled:
        where = [*builder.filters(shared), f"timestamp > {start}", f"timestamp <= {end}"]
        labels = (
            f"SELECT labels_key, any(labels) AS series_labels, toUInt8(1) AS found "
            f"FROM {builder.database}.metrics WHERE {' AND '.join(where)} GROUP BY labels_key"
        )
        series += f" LEFT JOIN ({labels}) AS l USING (labels_key)"
    # ties between devices go to the same one as a rule read alone takes (QueryBuilder.leaf)
    return (
        f"SELECT r, node_id, {key} AS key, argMax(device, (x, device)) AS dev_high, max(x) AS high, "
        "argMin(device, (x, device)) AS dev_low, min(x) AS low "
        f"FROM {series} ARRAY JOIN arrayConcat({', '.join(passing)}) AS r "
        "GROUP BY r, node_id, key ORDER BY r, node_id, key"
    )


def worst(member: Condition, high: tuple[str, float], low: tuple[str, float]) -> tuple[str, float]:
    """The (device, value) a member reports of a node: its worst series as its operator reads worst."""
    return low if member.operator in LOWER_IS_WORSE else high
