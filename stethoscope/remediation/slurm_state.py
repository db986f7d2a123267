"""What Slurm shows now (`scontrol -o show node`, read with the collection's own parser): which nodes
are out of service (DRAIN or DOWN, whoever set it) and with which reason. None when Slurm cannot be
asked (no scontrol, no controller): the breaker then counts what the actions table holds."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from stethoscope.paths import project_root


@dataclass(frozen=True)
class SlurmNode:
    name: str
    out_of_service: bool  # DRAIN (any flavour) or DOWN
    reason: str


def _parser() -> Any:
    try:
        from ansible_collections.aicluster.stethoscope.plugins.module_utils import slurm
    except ImportError:  # the collection as the playbooks see it (ANSIBLE_COLLECTIONS_PATH)
        sys.path.append(str(project_root() / ".collections"))
        from ansible_collections.aicluster.stethoscope.plugins.module_utils import slurm
    return slurm


def read_nodes(
    environment: dict[str, str] | None = None, timeout: float = 10.0
) -> dict[str, SlurmNode] | None:
    binary = shutil.which("scontrol")
    if binary is None:
        return None
    env = {**os.environ, **(environment or {}), "LANGUAGE": "C", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            [binary, "-o", "show", "node"],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    slurm = _parser()
    nodes: dict[str, SlurmNode] = {}
    for line in done.stdout.splitlines():
        if not line.startswith("NodeName="):
            continue
        try:
            node = slurm.parse_show_node(line)
        except slurm.ParseError:
            continue
        down = node["state"] == "DOWN" or "DOWN" in node["flags"]
        nodes[node["name"]] = SlurmNode(node["name"], node["drained"] or down, node["reason"])
    return nodes
