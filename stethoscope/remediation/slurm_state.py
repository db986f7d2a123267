"""What Slurm shows now (`scontrol -o show node`, read with the collection's own parser): which nodes
are out of service (DRAIN or DOWN, whoever set it) and with which reason. None when Slurm cannot be
asked (no scontrol, no controller): the breaker then counts what the actions table holds."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from stethoscope.paths import COLLECTION, collections_path


@dataclass(frozen=True)
class SlurmNode:
    name: str
    out_of_service: bool  # DRAIN (any flavour) or DOWN
    reason: str


PARSER = ".".join((*COLLECTION, "plugins", "module_utils", "slurm"))


def _parser() -> Any:
    """The collection's own parser (plugins/module_utils/slurm.py, one parser for the module and the
    controller), imported under its name from the collection the package ships. sys.path is left
    alone: where no `ansible_collections` is imported yet, that namespace is created with only the
    shipped collections folder on its path; one already imported (ansible's loader, a test's) is
    used as it is."""
    if COLLECTION[0] not in sys.modules:
        spec = importlib.machinery.ModuleSpec(COLLECTION[0], None, is_package=True)
        spec.submodule_search_locations = [str(collections_path() / COLLECTION[0])]
        sys.modules[COLLECTION[0]] = importlib.util.module_from_spec(spec)
    return importlib.import_module(PARSER)


def scontrol_show(what: str, environment: dict[str, str] | None = None, timeout: float = 10.0) -> str | None:
    """`scontrol -o show WHAT`'s output, or None when Slurm cannot be asked (no scontrol, no
    controller, an error exit, no answer within `timeout`)."""
    binary = shutil.which("scontrol")
    if binary is None:
        return None
    env = {**os.environ, **(environment or {}), "LANGUAGE": "C", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            [binary, "-o", "show", what],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def read_nodes(
    environment: dict[str, str] | None = None, timeout: float = 10.0
) -> dict[str, SlurmNode] | None:
    shown = scontrol_show("node", environment, timeout)
    if shown is None:
        return None
    slurm = _parser()
    nodes: dict[str, SlurmNode] = {}
    for line in shown.splitlines():
        if not line.startswith("NodeName="):
            continue
        try:
            node = slurm.parse_show_node(line)
        except slurm.ParseError:
            continue
        down = node["state"] == "DOWN" or "DOWN" in node["flags"]
        nodes[node["name"]] = SlurmNode(node["name"], node["drained"] or down, node["reason"])
    return nodes
