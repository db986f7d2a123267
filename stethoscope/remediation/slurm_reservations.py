"""Slurm maintenance reservations (`scontrol -o show reservation`): which nodes are in one active
now, and until when. A finding of such a node is silenced for the reservation's duration
(remediation.silences). None when Slurm cannot be asked (no scontrol, no controller); a line not
understood is skipped, said on stderr."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from datetime import datetime

from stethoscope.remediation.slurm_state import scontrol_show

BRACKETS = re.compile(r"\[([^\[\]]*)\]")


@dataclass(frozen=True)
class Reservation:
    name: str
    nodes: tuple[str, ...]  # Slurm node names, expanded
    flags: tuple[str, ...]
    active: bool  # State=ACTIVE
    ends_ms: int

    @property
    def maintenance(self) -> bool:
        return "MAINT" in self.flags


def expand_hostlist(text: str) -> list[str]:
    """`node[01-03,07],login` as Slurm expands it (zero padding kept); ValueError on a bad one."""
    names: list[str] = []
    for part in _top_level(text):
        match = BRACKETS.search(part)
        if match is None:
            if "[" in part or "]" in part:
                raise ValueError(f"hostlist {text!r}: unbalanced brackets in {part!r}")
            names.append(part)
            continue
        head, tail = part[: match.start()], part[match.end() :]
        for middle in _ranges(match.group(1), text):
            names += expand_hostlist(f"{head}{middle}{tail}")
    return names


def _top_level(text: str) -> list[str]:
    """The comma-separated parts outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if depth != 0:
        raise ValueError(f"hostlist {text!r}: unbalanced brackets")
    return [p for p in [*parts, current] if p]


def _ranges(inside: str, text: str) -> list[str]:
    out = []
    for item in inside.split(","):
        low, _, high = item.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f"hostlist {text!r}: {item!r} is not a number or a range")
        width = len(low)
        out += [str(n).zfill(width) for n in range(int(low), int(high or low) + 1)]
    return out


def _ms(text: str) -> int:
    """A Slurm time (local time of scontrol, no zone) in ms since the epoch."""
    return int(datetime.fromisoformat(text).astimezone().timestamp() * 1000)


def parse_reservations(text: str) -> list[Reservation]:
    """`scontrol -o show reservation` output, one reservation a line; ValueError naming the line on
    an unexpected shape."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("ReservationName="):
            continue
        fields = dict(item.partition("=")[::2] for item in line.split())
        try:
            nodes = () if fields["Nodes"] in ("", "(null)") else tuple(expand_hostlist(fields["Nodes"]))
            found.append(
                Reservation(
                    fields["ReservationName"],
                    nodes,
                    tuple(fields.get("Flags", "").split(",")),
                    fields.get("State") == "ACTIVE",
                    _ms(fields["EndTime"]),
                )
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(f"scontrol show reservation: {exc} at line {number}") from None
    return found


def read_maintenance(
    environment: dict[str, str] | None = None, timeout: float = 5.0
) -> dict[str, tuple[str, int]] | None:
    """Slurm node name -> (reservation, its end in ms) of the active maintenance reservations; None
    when Slurm cannot be asked (a line not understood is skipped: maintenance_of)."""
    shown = scontrol_show("reservation", environment, timeout)
    if shown is None:
        return None
    return maintenance_of(shown)


def maintenance_of(shown: str) -> dict[str, tuple[str, int]]:
    """Of `scontrol -o show reservation` output, node -> (reservation, its end in ms) of the active
    maintenance reservations. A line not understood is skipped and said on stderr: one bad line does
    not take every node's maintenance away."""
    reservations: list[Reservation] = []
    for number, line in enumerate(shown.splitlines(), 1):
        try:
            reservations += parse_reservations(line)
        except ValueError as exc:
            said = str(exc).replace(" at line 1", f" at line {number}")
            print(f"stethoscope: {said}: that reservation is skipped", file=sys.stderr)
    return {node: (r.name, r.ends_ms) for r in reservations if r.maintenance and r.active for node in r.nodes}
