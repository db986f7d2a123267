#!/usr/bin/env python3
"""Crash recovery: `serve --execute` cycling fast (no sweeps; the data is in the
store) on the lab's 8 Slurm nodes (a real slurmctld from tools/slurm_lab.py) with a worn SSD on
node03 whose rule drains, bundles evidence and opens a Jira ticket (a loopback stand-in). At each of
10 points of that action sequence serve and every process under it are killed with SIGKILL (as
systemd kills a unit's cgroup), and serve is started again. Per point: seconds from the restart to
the incident's completion, the cycles the successor ran by then, the drains Slurm took and the
tickets opened (both must be exactly 1), and whether the successor's first line said `executing`.

    .venv/bin/python benchmarks/crash_recovery.py [--interval 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOP / "tools"))
sys.path.insert(0, str(TOP / "tests" / "helpers"))

from http_standin import Request, StandIn  # noqa: E402  (the tests' loopback Jira)
from provenance import RESULTS, write_results  # noqa: E402
from slurm_lab import SlurmCluster  # noqa: E402

from stethoscope.store.batch import MetricColumns  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.timeutil import now_ms  # noqa: E402

NODES = [f"node0{i}" for i in range(1, 9)]
SICK = "node03"
# where serve dies: in the drain (scontrol), in the evidence bundle (each tool it runs), in the ticket
# (each Jira call)
POINTS = (
    "before_scontrol_update",
    "after_scontrol_update",
    "evidence_nvidia-smi",
    "evidence_dmesg",
    "evidence_journalctl",
    "evidence_ibstat",
    "evidence_lspci",
    "jira_search",
    "jira_create",
    "jira_attach",
)
RULE = """
- rule_id: worn_ssd
  description: worn SSD (benchmark)
  severity: critical
  level: L4
  message: "{{ node_id }} {{ device }} worn"
  trigger:
    - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 30m, aggregate: last}
  action:
    - {type: playbook, playbook: remediate/drain.yml}
    - {type: playbook, playbook: remediate/evidence.yml}
    - {type: playbook, playbook: remediate/ticket.yml}
"""


class Jira(StandIn):
    """Stalls once at `point` (a Jira call under way when serve dies): after creating the issue for
    jira_create, before answering the others."""

    def __init__(self, point: str):
        super().__init__()
        self.point, self.reached, self.release = point, threading.Event(), threading.Event()

    def answer(self, request: Request) -> tuple[int, object]:
        path = request.path.split("?", 1)[0]
        kind = {"/rest/api/2/search": "jira_search", "/rest/api/2/issue": "jira_create"}.get(path, "")
        kind = kind or ("jira_attach" if path.endswith("/attachments") else "")
        stall = kind == self.point and not self.reached.is_set()
        if stall and kind != "jira_create":
            self.reached.set()
            self.release.wait(300)
        answer = super().answer(request)
        if stall and kind == "jira_create":
            self.reached.set()
            self.release.wait(300)
        return answer


def wrappers(folder: Path, crash: Path) -> Path:
    folder.mkdir()
    stall = f'mkdir "{crash}/stalled" 2>/dev/null && {{ touch "{crash}/reached"; sleep 300; }}'
    real = subprocess.run(["which", "scontrol"], capture_output=True, text=True, check=True).stdout.strip()
    (folder / "scontrol").write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
          *" update "*)
            [ "$CRASH_POINT" = before_scontrol_update ] && {stall}
            "{real}" "$@"; rc=$?
            [ "$rc" -eq 0 ] && echo "$*" >> "{crash}/updates"
            [ "$CRASH_POINT" = after_scontrol_update ] && {stall}
            exit "$rc";;
        esac
        exec "{real}" "$@"
        """)
    )
    for tool in ("nvidia-smi", "dmesg", "journalctl", "ibstat", "lspci"):
        (folder / tool).write_text(f'#!/bin/sh\n[ "$CRASH_POINT" = evidence_{tool} ] && {stall}\necho ok\n')
    for tool in folder.iterdir():
        tool.chmod(0o755)
    return folder


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_all(proc: subprocess.Popen) -> None:
    family = [proc.pid, *descendants(proc.pid)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    proc.wait(30)


class Serve:
    def __init__(self, command: list[str], env: dict[str, str], log: Path):
        self.err = log.open("w")
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self.err, text=True, env=env)
        assert self.proc.stdout is not None
        self.head = self.proc.stdout.readline()
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()  # type: ignore[arg-type]

    def cycles(self) -> int:
        return sum(1 for line in list(self.lines) if line.startswith('{"event": "cycle"'))


def wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def one_point(root: Path, slurm: SlurmCluster, point: str, interval: float) -> dict[str, object]:
    slurm.undrain_all()
    jira = Jira(point).start()
    crash = root / "crash"
    crash.mkdir()
    tools = wrappers(root / "bin", crash)
    inventory = root / "hosts.yml"
    hosts = "\n".join(
        f"    {n}: {{slurm_name: {n}, stethoscope_node_key: {i}}}" for i, n in enumerate(NODES, 1)
    )
    local = 'ansible_connection: local\n    ansible_python_interpreter: "{{ ansible_playbook_python }}"'
    inventory.write_text(f"---\nall:\n  vars:\n    {local}\n  hosts:\n{hosts}\n")
    (root / "rules.yml").write_text(textwrap.dedent(RULE))
    (root / "secret").write_bytes(b"crash-recovery-benchmark-secret-0123456789\n")
    dsn = f"chdb://{root / 'db'}"
    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for node in NODES:
            sectors = 184.0 if node == SICK else 0.0
            batch.append(node, "smart_reallocated_sector_ct", "sda", {}, sectors, now_ms())
        store.insert_metrics(batch)
    evidence = root / "evidence"
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(root / "spool"), "serve",
        "--inventory", str(inventory), "--secret-file", str(root / "secret"), "--no-model", "--no-sweep",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", str(interval),
        "--rules", str(root / "rules.yml"), "--log-format", "json", "--execute",
        "-e", f"stethoscope_ticket_url={jira.url}", "-e", f"stethoscope_evidence_dir={evidence}",
        "-e", f"stethoscope_diagnose_log={root / 'findings.log'}", "-e", "ticket_timeout=120",
    ]  # fmt: skip
    env = {
        **os.environ,
        **slurm.env,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "STETHOSCOPE_TICKET_USER": "bot",
        "STETHOSCOPE_TICKET_TOKEN": "t0ken",
        "STETHOSCOPE_LOCK_DIR": str(root / "locks"),
    }
    result: dict[str, object] = {"point": point}
    first = Serve(command, {**env, "CRASH_POINT": point}, root / "first.log")
    reached = wait(lambda: (crash / "reached").exists() or jira.reached.is_set(), 180)
    kill_all(first.proc)
    jira.release.set()
    restarted = time.monotonic()
    second = Serve(command, env, root / "second.log")

    def done() -> bool:
        ticketed = any(r.path.endswith("/comment") for r in list(jira.requests)) or any(
            len(issue["attachments"]) == 2 for issue in list(jira.issues.values())
        )
        return ticketed and any(evidence.glob(f"*/{SICK}.tar.gz")) and "DRAIN" in slurm.node(SICK)["state"]

    completed = wait(done, 300)
    seconds = time.monotonic() - restarted
    cycles = second.cycles()
    second.proc.send_signal(signal.SIGTERM)
    try:
        second.proc.wait(120)
    except subprocess.TimeoutExpired:
        kill_all(second.proc)
    updates = crash / "updates"
    result.update(
        reached=reached,
        completed=completed,
        seconds_to_completion=round(seconds, 1) if completed else None,
        successor_cycles_by_completion=cycles,
        successor_first_line_executing="executing" in second.head,
        drains=len(updates.read_text().splitlines()) if updates.exists() else 0,
        tickets=len(jira.issues),
    )
    jira.stop()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=5.0, help="serve's cycle interval (s)")
    parser.add_argument("--out", type=Path, default=RESULTS / "crash_recovery.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="crash-recovery-") as folder:
        slurm = SlurmCluster(Path(folder) / "slurm").start()
        try:
            points = []
            for point in POINTS:
                root = Path(folder) / point
                root.mkdir()
                points.append(one_point(root, slurm, point, args.interval))
                print(json.dumps(points[-1]), flush=True)
        finally:
            slurm.stop()
    exact = all(p["completed"] and p["drains"] == 1 and p["tickets"] == 1 for p in points)
    write_results(
        args.out,
        {
            "interval_seconds": args.interval,
            "points": points,
            "all_exactly_one_drain_and_ticket": exact,
            "max_seconds_to_completion": max((p["seconds_to_completion"] or 0) for p in points),
        },
    )
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
