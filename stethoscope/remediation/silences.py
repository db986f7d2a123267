"""Silences, as Alertmanager users know them: matchers on a finding's node_id, rule_id and device,
ANDed, each `key=value` or `key=~regex` (anchored), for a while, with a reason. A finding an
active silence or a Slurm maintenance reservation of its node matches takes no action; it is
recorded as `silenced` (remediation.life) and its outcome says by what. Silences apply at the moment
a cycle runs (the wall clock), whatever time it evaluates."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stethoscope.timeutil import iso

SILENCED = "silenced"  # a finding's status while something silences it (besides open, stale, resolved)
KEYS = ("node_id", "rule_id", "device")
MATCHER = re.compile(r"(?P<key>[a-z_]+)(?P<op>=~|=)(?P<value>.*)", re.DOTALL)


@dataclass(frozen=True)
class Matcher:
    key: str  # node_id | rule_id | device
    op: str  # = | =~
    value: str

    def matches(self, finding: dict[str, Any]) -> bool:
        seen = str(finding.get(self.key) or "")
        if self.op == "=":
            return seen == self.value
        return re.fullmatch(self.value, seen) is not None

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


def parse_matcher(text: str) -> Matcher:
    """`node_id=node03`, `rule_id=~gpu_.*`; ValueError saying what is wrong."""
    found = MATCHER.fullmatch(text)
    if found is None or found["key"] not in KEYS:
        raise ValueError(
            f"--match {text!r}: expected KEY=VALUE or KEY=~REGEX with KEY one of {', '.join(KEYS)}"
        )
    if found["op"] == "=~":
        try:
            re.compile(found["value"])
        except re.error as exc:
            raise ValueError(
                f"--match {text!r}: {found['value']!r} is not a regular expression ({exc})"
            ) from None
    return Matcher(found["key"], found["op"], found["value"])


@dataclass(frozen=True)
class Silence:
    silence_id: str
    matchers: tuple[Matcher, ...]
    starts_ms: int
    ends_ms: int
    created_by: str
    reason: str
    version: int = 0

    def active(self, at_ms: int) -> bool:
        return self.starts_ms <= at_ms < self.ends_ms

    def matches(self, finding: dict[str, Any]) -> bool:
        return bool(self.matchers) and all(m.matches(finding) for m in self.matchers)

    def as_dict(self) -> dict[str, Any]:
        return {
            "silence_id": self.silence_id,
            "matchers": [str(m) for m in self.matchers],
            "starts_at": iso(self.starts_ms),
            "ends_at": iso(self.ends_ms),
            "created_by": self.created_by,
            "reason": self.reason,
        }


def silencing(
    finding: dict[str, Any],
    silences: Iterable[Silence],
    maintenance: dict[str, tuple[str, int]],
    at_ms: int,
) -> str | None:
    """What silences the finding at `at_ms`: "<silence_id>: <reason>", "maintenance <reservation>:
    Slurm maintenance …", or None. `maintenance`: node -> (reservation, its end in ms)."""
    for s in silences:
        if s.active(at_ms) and s.matches(finding):
            return f"{s.silence_id}: {s.reason}"
    held = maintenance.get(str(finding.get("node_id") or ""))
    if held is not None and at_ms < held[1]:
        return f"maintenance {held[0]}: Slurm maintenance until {iso(held[1])}"
    return None


def mark_silenced(
    findings: list[dict[str, Any]],
    silences: Iterable[Silence],
    maintenance: dict[str, tuple[str, int]],
    at_ms: int,
) -> int:
    """Set `silenced` and the outcome of each finding something silences; how many it did."""
    chosen = list(silences)
    count = 0
    for finding in findings:
        why = silencing(finding, chosen, maintenance, at_ms)
        if why is None:
            finding.pop("silenced", None)
            continue
        finding["silenced"] = why
        finding["outcome"] = f"silenced by {why}: no action"
        count += 1
    return count
