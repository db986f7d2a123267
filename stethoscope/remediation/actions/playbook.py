"""Remediation playbooks through ansible-runner: `--limit` to one validated inventory name, the finding
and its transaction id as extra vars, the ansible.cfg and the collection the package ships (or the
checkout's ansible.cfg, run from one) through envvars (ansible-runner does not read them from its own
working dir), and its structured events recorded. The playbook runs in the current directory, so its
callback finds the same state folder as this process (stethoscope.paths).

A shipped playbook with nothing to act with (its backend not configured) says so with `set_stats:
{data: {stethoscope_skipped: REASON}}` and ends the host: the run is recorded `skipped`, with the
reason, never `failed` (the stats reach the executor in the runner's playbook_on_stats event)."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.paths import ansible_cfg, collections_path, playbooks_dir

RECORDED_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_on_unreachable", "runner_on_skipped")
MAX_EVENTS = 200
SKIPPED = "stethoscope_skipped"  # the set_stats key of a playbook that had nothing to act with


@dataclass
class PlaybookResult:
    ok: bool
    status: str
    rc: int | None
    events: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""  # why the playbook did not act (SKIPPED), when it said so


def playbook_path(name: str) -> Path:
    return playbooks_dir() / name


def run_playbook(
    name: str,
    inventory: Path,
    limit: str | None,
    extravars: dict[str, Any],
    envvars: dict[str, str],
    timeout: int = 1800,
) -> PlaybookResult:
    import ansible_runner

    top = Path.cwd()
    events: list[dict[str, Any]] = []

    stats: dict[str, Any] = {}
    skipped: list[str] = []

    def keep(event: dict[str, Any]) -> bool:
        if event.get("event") == "playbook_on_stats":
            data = event.get("event_data") or {}
            stats.update({k: data.get(k) or {} for k in ("ok", "changed", "failures", "skipped", "dark")})
            reason = (data.get("artifact_data") or {}).get(SKIPPED)
            if reason:
                skipped.append(str(reason))
        if event.get("event") in RECORDED_EVENTS and len(events) < MAX_EVENTS:
            data = event.get("event_data") or {}
            result = data.get("res") or {}
            events.append(
                {
                    "event": event["event"],
                    "host": data.get("host"),
                    "task": data.get("task"),
                    "changed": bool(result.get("changed")),
                    "msg": str(result.get("msg", ""))[:300],
                }
            )
        return True

    env = {
        "ANSIBLE_CONFIG": str(ansible_cfg()),
        "ANSIBLE_COLLECTIONS_PATH": str(collections_path()),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
        # ansible-playbook of this environment, also when the venv is not activated
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        **envvars,
    }
    with tempfile.TemporaryDirectory(prefix="stethoscope-runner-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(top),
            playbook=str(playbook_path(name)),
            inventory=str(inventory),
            limit=limit,
            extravars=extravars,
            envvars=env,
            quiet=True,
            timeout=timeout,
            event_handler=keep,
        )
    ok = runner.status == "successful" and runner.rc == 0
    return PlaybookResult(ok, runner.status, runner.rc, events, stats, "; ".join(skipped) if ok else "")
