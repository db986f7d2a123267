"""Rules read in one pass: single-condition rules that aggregate the same metric the same way over the
same window and differ only in labels, operator and threshold (the 21 XID rules: `delta` of
gpu_xid_errors_total over 15 minutes, one per `xid` label) form a family whose series are read and
aggregated once; each member then keeps the series its labels name that pass its own comparison.

The family's query (engine.QueryBuilder.family) is the members' shared aggregate per series (read
with the union of their label filters), each series' labels looked up by its `labels_key` in its raw
rows of the window (the rows its aggregate reads), and one row per member, node and enclosing device
that passes: `r` the member's place in the family, the device and value of its worst series each way
(as a member's operator reads worst).
"""

from __future__ import annotations

from collections.abc import Sequence

from stethoscope.diagnosis.rules import Condition, Group, Rule

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


def worst(member: Condition, high: tuple[str, float], low: tuple[str, float]) -> tuple[str, float]:
    """The (device, value) a member reports of a node: its worst series as its operator reads worst."""
    return low if member.operator in LOWER_IS_WORSE else high


def device_regex(pattern: str) -> str:
    """A condition's device pattern (`gpu*`) as the regular expression its series' device matches."""
    return "^" + "".join(".*" if c == "*" else c if c.isalnum() else "\\" + c for c in pattern) + "$"
