"""The lab's agents (docs/design.md "The lab"): one agent per lab node, reading that node's root prefix
and replaying the recorded H200 capture (nvidia-smi --query-gpu at 2 Hz under load) as its GPUs."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from stethoscope.paths import h200_capture, project_root
from stethoscope.telemetry.agent import Agent, Counters
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import MetricSet


def lab_dir() -> Path:
    return Path(os.environ.get("STETHOSCOPE_LAB_DIR") or project_root() / ".lab").resolve()


def agent_config(
    node_id: str,
    keyring: Keyring,
    metric_set: MetricSet,
    collector: str,
    root: Path,
    period: float | None = None,
    gpu_source: str | None = None,
) -> dict[str, Any]:
    """The configuration the push_agent role writes to a node, for one lab node."""
    node_key, key = keyring.key_for(node_id)
    return {
        "collector": collector,
        "node_id": node_id,
        "node_key": node_key,
        "key": key.hex(),
        "set": metric_set.render(),
        "period": period or metric_set.period,
        "root": str(root),
        "gpu_source": gpu_source or f"capture:{h200_capture()}",
    }


def lab_agents(
    keyring: Keyring,
    metric_set: MetricSet,
    collector: str,
    period: float | None = None,
    nodes: list[str] | None = None,
    directory: Path | None = None,
) -> list[Agent]:
    directory = directory or lab_dir()
    names = nodes or sorted(keyring.nodes.values())
    agents = []
    for node in names:
        root = directory / "nodes" / node / "root"
        if root.is_dir():
            agents.append(Agent(agent_config(node, keyring, metric_set, collector, root, period)))
    return agents


def run_agents(agents: list[Agent], duration: float | None) -> list[Counters]:
    """Run every agent in a thread of its own until `duration` passes or each is stopped."""
    threads = [threading.Thread(target=agent.run, args=(duration,), daemon=True) for agent in agents]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        for agent in agents:
            agent.stop.set()
        for thread in threads:
            thread.join()
    return [agent.counters for agent in agents]
