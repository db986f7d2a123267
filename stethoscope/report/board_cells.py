"""The health board's data (stethoscope.report.board builds it, board_html draws it): per node a cell
per layer and day, the node's events, grades and trends, and the states' symbols."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from stethoscope.bench import baseline
from stethoscope.catalog import LAYERS
from stethoscope.report.smart import Trend

RANK = {"grey": 0, "green": 1, "yellow": 2, "red": 3}
# ✖ ▲ ✔ ? and – for a day with data that no recorded evaluation covers (never green: nobody looked)
SYMBOL = {"red": "\u2716", "yellow": "\u25b2", "green": "\u2714", "grey": "?", "unevaluated": "\u2013"}
UNEVALUATED = "unevaluated"


@dataclass
class Cell:
    state: str = "grey"  # no data until samples say otherwise
    notes: list[str] = field(default_factory=list)
    unknown: bool = False
    data: bool = False
    evaluated: bool = False  # a recorded evaluation (serve, watch, --execute) or today's covers it

    def mark(self, state: str, note: str) -> None:
        if state == "grey":
            self.unknown = True
        else:
            self.data = True  # a finding or a benchmark grade is data too
            if RANK[state] > RANK[self.state]:
                self.state = state
        self.note(note)

    def note(self, note: str) -> None:
        """Said in the cell, its colour unchanged (a model finding beside a rule finding)."""
        if note and note not in self.notes:
            self.notes.append(note)

    @property
    def shown(self) -> str:
        """grey without data or under UNKNOWN unless a finding made it red or yellow; with data that
        no evaluation covered, `unevaluated` (grey too): green only where something looked."""
        if self.state in ("red", "yellow"):
            return self.state
        if self.unknown or not self.data:
            return "grey"
        return "green" if self.evaluated else UNEVALUATED

    @property
    def symbol(self) -> str:
        return SYMBOL[self.shown]


@dataclass
class Event:
    at: str
    kind: str  # opened, escalated, resolved, stale
    rule_id: str
    severity: str
    device: str
    message: str


@dataclass(frozen=True)
class Reason:
    """A finding that made a cell red or yellow, for the node's page."""

    day: str
    layer: str
    state: str
    rule_id: str
    severity: str
    device: str
    message: str
    source: str  # "recorded" (the findings table) or "evaluated now" (today's column)


@dataclass
class NodeIncident:
    """An incident of the node (a transaction of the findings table) and what was done for it."""

    txn_id: str
    severity: str
    status: str
    rules: str
    first_seen: str
    drain: str  # its drain's status and start, "" if none
    ticket: str  # the ticket's key, else its status, "" if none
    actions: str  # every action with its latest status


@dataclass
class NodeBoard:
    node_id: str
    cells: dict[tuple[str, str], Cell]
    events: list[Event] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    incidents: list[NodeIncident] = field(default_factory=list)
    grades: list[baseline.Row] = field(default_factory=list)
    trends: list[Trend] = field(default_factory=list)
    page: str = ""
    figure: str = ""  # inline SVG (worst nodes only)

    def row(self, layers: tuple[str, ...], days: list[str]) -> list[tuple[str, str, str]]:
        """(state, symbol, notes) per column, layer by layer and day by day."""
        cells = (self.cells[(layer, day)] for layer in layers for day in days)
        return [(c.shown, SYMBOL[c.shown], "; ".join(c.notes)) for c in cells]

    def count(self, state: str) -> int:
        return sum(1 for cell in self.cells.values() if cell.shown == state)

    @property
    def score(self) -> tuple[int, int, int]:
        """(red, yellow, grey or not evaluated) cells: the board's order, worst first."""
        shown = Counter(cell.shown for cell in self.cells.values())  # one pass: 2,000 nodes sort on it
        return (shown["red"], shown["yellow"], shown["grey"] + shown[UNEVALUATED])

    def explain(self, reason: Reason) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)


@dataclass
class Board:
    days: list[str]
    nodes: list[NodeBoard]
    generated_at: str
    layers: tuple[str, ...] = LAYERS
    audit_page: str | None = None
    baseline_page: str | None = None
