"""The most likely fault path through the topology (docs/design.md "Learned diagnosis"), from the
`nodes` table's rack and switch of each node. Pure: nodes and scores in, one path per node out.

- An anomaly spanning two or more nodes behind one switch runs through that switch:
  "A → <switch> → C", where A is the most anomalous of them and C the next (highest score first,
  ties by node id); every node of the group gets that path.
- Nodes with no switch recorded are grouped by rack the same way.
- A node alone (no anomalous neighbour, or no topology known) is its own path: its node id.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

ARROW = " → "


@dataclass(frozen=True)
class Place:
    rack: str = ""
    switch: str = ""


def fault_paths(scores: Mapping[str, float], topology: Mapping[str, Place]) -> dict[str, str]:
    """scores: anomalous node -> how anomalous (e.g. the finding's confidence); -> node -> path."""
    by_switch: dict[str, list[str]] = {}
    by_rack: dict[str, list[str]] = {}
    for node in scores:
        place = topology.get(node, Place())
        if place.switch:
            by_switch.setdefault(place.switch, []).append(node)
        elif place.rack:
            by_rack.setdefault(place.rack, []).append(node)
    paths = {node: node for node in scores}
    for hub, members in (*sorted(by_switch.items()), *sorted(by_rack.items())):
        if len(members) < 2:
            continue
        first, second = sorted(members, key=lambda n: (-scores[n], n))[:2]
        for node in members:
            paths[node] = f"{first}{ARROW}{hub}{ARROW}{second}"
    return paths
