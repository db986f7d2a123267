"""What becomes of an open rule finding that did not match this evaluation (docs/design.md "Rules",
the life of a finding).

A finding resolves only after its condition has been clear for a whole window of fresh data: its
rule has not matched for the rule's longest window (as fitted to the cadence; an hour at most, so a
month's growth rule needs no month of silence) and, over that window, every condition it needs has
at least half the reports its cadence expects. A sweep that came late or was lost is no evidence of
health: the finding is held open, and is reported as open. When its data stopped altogether, it is
stale (UNKNOWN speaks for the data), never resolved.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stethoscope.diagnosis.cadence import window_of
from stethoscope.diagnosis.engine import sample_counts
from stethoscope.diagnosis.rules import Condition, Group, Rule, fmt_duration
from stethoscope.store.client import Store
from stethoscope.timeutil import iso

HELD, RESOLVED, STALE = "held", "resolved", "stale"
HOLD_CAP_SECONDS = 3600
CLEAR_SHARE = 0.5  # of the reports a window expects: enough fresh data to call it clear


@dataclass(frozen=True)
class Previous:
    """A finding open (or stale) before this evaluation: from the findings table, or what a dry-run
    `watch` or `serve` remembers of its last cycle."""

    finding_id: str
    rule_id: str
    node_id: str
    device: str
    severity: str
    status: str  # open | stale
    first_seen_ms: int
    last_seen_ms: int  # the last evaluation that matched it
    txn_id: str = ""
    level: str = ""
    confidence: float = 1.0
    message: str = ""
    evidence: str = "{}"


@dataclass(frozen=True)
class Held:
    """A finding that did not match now and stays open, and why."""

    previous: Previous
    why: str


def held_reason(previous: Previous, rules: Sequence[Rule]) -> str:
    rule = next((r for r in rules if r.rule_id == previous.rule_id), None)
    window = f" ({fmt_duration(hold_seconds(rule))})" if rule is not None else ""
    return (
        f"held open: last matched at {iso(previous.last_seen_ms)}, not yet clear for a whole window"
        f"{window} of fresh data"
    )


def hold_seconds(rule: Rule) -> int:
    return min(window_of(rule), HOLD_CAP_SECONDS)


def _clear_samples(condition: Condition, seconds: int) -> int:
    interval = condition.cadence_seconds or condition.interval_seconds
    return max(1, math.ceil(CLEAR_SHARE * seconds / max(interval, 1)))


def _covered(group: Group, enough: dict[Condition, set[str]], node: str) -> bool:
    """Whether the node's fresh data answers the group (an `any` needs one branch, `all` every one)."""
    results = (
        _covered(item, enough, node) if isinstance(item, Group) else node in enough[item]
        for item in group.items
    )
    return all(results) if group.mode == "all" else any(results)


def settle(store: Store, rule: Rule, silent: Iterable[Previous], at_ms: int) -> dict[str, str]:
    """finding_id -> held | resolved | stale for the findings of `rule` (fitted to the cadence) that
    did not match at `at_ms`."""
    silent = list(silent)
    if not silent:
        return {}
    seconds = hold_seconds(rule)
    nodes = sorted({p.node_id for p in silent})
    enough: dict[Condition, set[str]] = {}  # nodes with fresh data enough for each condition
    per_device: dict[tuple[str, str], float] = {}  # (node, device) -> its best share of the reports due
    for condition in rule.conditions:
        lookback = min(condition.window_seconds, HOLD_CAP_SECONDS)
        counts = sample_counts(store, condition, nodes, at_ms, lookback)
        needed = _clear_samples(condition, lookback)
        node_counts: dict[str, int] = {}
        for (node, device), count in counts.items():
            node_counts[node] = max(node_counts.get(node, 0), count)
            per_device[(node, device)] = max(per_device.get((node, device), 0.0), count / needed)
        enough[condition] = {node for node, count in node_counts.items() if count >= needed}
    verdicts = {}
    for previous in silent:
        # the finding's own device (or one it encloses, or that encloses it) must still report: a GPU
        # fallen off the bus is no healthy GPU, however well its node's other GPUs report
        share = max(
            (
                s
                for (node, device), s in per_device.items()
                if node == previous.node_id and _related(device, previous.device)
            ),
            default=0.0,
        )
        if share == 0:
            verdicts[previous.finding_id] = STALE  # the data stopped: UNKNOWN speaks, nothing resolves
        elif at_ms - previous.last_seen_ms < seconds * 1000:
            verdicts[previous.finding_id] = HELD  # not clear for a whole window yet
        elif share >= 1 and _covered(rule.when, enough, previous.node_id):
            verdicts[previous.finding_id] = RESOLVED
        else:
            verdicts[previous.finding_id] = HELD  # sweeps late or lost: too little data to call it clear
    return verdicts


def _related(device: str, finding_device: str) -> bool:
    """Whether `device`'s rows speak for the finding's device: it, a part of it (gpu2/link3 of gpu2)
    or what it is part of (mlx5_0 of mlx5_0/1); any device for a node-level finding."""
    return (
        not finding_device
        or device == finding_device
        or device.startswith(f"{finding_device}/")
        or finding_device.startswith(f"{device}/")
    )


def settle_all(store: Store, rules: Sequence[Rule], silent: Iterable[Previous], at_ms: int) -> dict[str, str]:
    """`settle` for each rule's silent findings; findings of rules not in `rules` are left out."""
    by_rule: dict[str, list[Previous]] = {}
    for previous in silent:
        by_rule.setdefault(previous.rule_id, []).append(previous)
    verdicts: dict[str, str] = {}
    for rule in rules:
        verdicts.update(settle(store, rule, by_rule.get(rule.rule_id, []), at_ms))
    return verdicts
