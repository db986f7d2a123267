"""Incidents (docs/design.md "Rules", the life of a finding): the findings of one failure on one node
share one transaction, whose id is the incident's: one evidence bundle, one ticket, one drain.

A new finding joins an open incident (one with a finding not resolved)
- of its rule's family on the same node and device, however long ago that opened, else
- on the same node and enclosing device (`gpu2/link3` and `gpu2` are `gpu2`'s; `mlx5_0/1` and
  `mlx5_0` are `mlx5_0`'s: the catalog's device kinds) whose latest finding matched within the
  incident window (`stethoscope_incident_window`, default 1h); a finding with no device joins the
  node's open incident.
UNKNOWN findings and correlated ones (a switch's or rack's: node_id `switch:leaf1`) keep their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.levels import SEVERITY_ORDER

DEFAULT_WINDOW_SECONDS = 3600


def enclosing_device(catalog: Catalog, device: str) -> str:
    """The device that encloses `device` (its own name when none does): a kind of device with a
    parent (an NVLink link, an HCA port) is part of the device its name begins with."""
    for kind in catalog.device_kinds.values():
        if kind.parent is None or not re.fullmatch(kind.pattern, device):
            continue
        outer = kind
        while outer.parent is not None:
            outer = catalog.device_kinds[outer.parent]
        parts = device.split("/")
        for length in range(len(parts) - 1, 0, -1):
            head = "/".join(parts[:length])
            if re.fullmatch(outer.pattern, head):
                return head
    return device


def keeps_own(rule_id: str, node_id: str) -> bool:
    """UNKNOWN and correlated findings are incidents of their own: they never join nor are joined."""
    return rule_id.startswith("unknown.") or ":" in node_id


@dataclass
class Incident:
    txn_id: str
    node_id: str
    device: str  # the enclosing device; "" for a node-level incident
    severity: str  # its worst finding's
    last_seen_ms: int  # when one of its findings last matched
    joinable: bool = True  # an UNKNOWN or correlated finding's is not
    families: set[tuple[str, str]] = field(default_factory=set)  # (family, device) of its findings

    def worse(self, severity: str) -> bool:
        return SEVERITY_ORDER[severity] > SEVERITY_ORDER[self.severity]


class OpenIncidents:
    """The open incidents of the ledger, and those opened this cycle, by node."""

    def __init__(self, catalog: Catalog, window_ms: int):
        self.catalog = catalog
        self.window_ms = window_ms
        self.by_txn: dict[str, Incident] = {}

    def add(
        self, txn_id: str, rule_id: str, node_id: str, device: str, severity: str, seen_ms: int, family: str
    ) -> None:
        """A finding not resolved of transaction `txn_id` (which it opens, or whose incident it is of)."""
        incident = self.by_txn.get(txn_id)
        if incident is None:
            own = keeps_own(rule_id, node_id)
            group = device if own else enclosing_device(self.catalog, device)
            incident = Incident(txn_id, node_id, group, severity, seen_ms, joinable=not own)
            self.by_txn[txn_id] = incident
        if incident.worse(severity):
            incident.severity = severity
        incident.last_seen_ms = max(incident.last_seen_ms, seen_ms)
        if family:
            incident.families.add((family, device))

    def find(
        self, rule_id: str, node_id: str, device: str, family: str, at_ms: int
    ) -> tuple[Incident, str] | None:
        """The open incident a new finding joins, and why; None: it opens one of its own."""
        if keeps_own(rule_id, node_id):
            return None
        on_node = [i for i in self.by_txn.values() if i.joinable and i.node_id == node_id]
        if family:
            for incident in on_node:
                if (family, device) in incident.families:
                    return incident, f"family {family}"
        group = enclosing_device(self.catalog, device)
        near = [
            i
            for i in on_node
            if at_ms - i.last_seen_ms <= self.window_ms and (i.device == group or not device)
        ]
        if not near:
            return None
        best = max(near, key=lambda i: (i.device == group, SEVERITY_ORDER[i.severity], i.last_seen_ms))
        return best, f"same {'node' if not device else 'device ' + (group or '-')}"
