"""Crash-safe actions: `serve --execute` killed with SIGKILL, its playbooks with it (as
systemd kills a unit's whole cgroup), at any point of an incident's drain -> evidence -> ticket, and
started again: the successor acts at once (no wait for the dead executor's heartbeat), says from its
first line that it executes, reconciles what was in flight (Slurm read back; evidence and ticket run
again, idempotent by txn) and runs what had not started, in its first cycle: exactly one drain in
Slurm and one Jira issue. A slow action never holds up the next cycle."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from http_standin import Request, StandIn

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

NODES = [f"node0{i}" for i in range(1, 9)]
SICK = "node03"
SECRET = b"crash-safe-secret-0123456789abcdef"
ACTIONS = ("playbook:remediate/drain.yml", "playbook:remediate/evidence.yml", "playbook:remediate/ticket.yml")
RECONCILED = "reconciled after a crash"


class StallingJira(StandIn):
    """The Jira stand-in; with `stall`, its first issue is created and then the answer waits (the
    ticket call is under way when serve is killed)."""

    def __init__(self, stall: bool):
        super().__init__()
        self.stall = stall
        self.reached = threading.Event()
        self.release = threading.Event()

    def answer(self, request: Request) -> tuple[int, object]:
        answer = super().answer(request)
        if self.stall and request.path == "/rest/api/2/issue" and not self.reached.is_set():
            self.reached.set()
            self.release.wait(120)
        return answer


def wrappers(folder: Path, crash_dir: Path) -> Path:
    """`scontrol` and `dmesg` first on serve's PATH: each stalls once at its crash point; scontrol
    notes every update Slurm took."""
    folder.mkdir()
    stall = (
        f'if [ "$CRASH_POINT" = "{{point}}" ] && mkdir "{crash_dir}/stalled" 2>/dev/null; then '
        f'touch "{crash_dir}/reached"; sleep 120; fi'
    )
    real = subprocess.run(["which", "scontrol"], capture_output=True, text=True, check=True).stdout.strip()
    (folder / "scontrol").write_text(
        textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
          *" update "*)
            {stall.format(point="before_drain")}
            "{real}" "$@"; rc=$?
            [ "$rc" -eq 0 ] && echo "$*" >> "{crash_dir}/updates"
            {stall.format(point="after_drain")}
            exit "$rc";;
        esac
        exec "{real}" "$@"
        """)
    )
    (folder / "dmesg").write_text(f"#!/bin/sh\n{stall.format(point='during_evidence')}\necho 'kernel: ok'\n")
    for tool in ("scontrol", "dmesg"):
        (folder / tool).chmod(0o755)
    return folder


def lab(tmp_path: Path) -> tuple[Path, Path, Path]:
    inventory = tmp_path / "hosts.yml"
    hosts = "\n".join(
        f"    {node}: {{slurm_name: {node}, stethoscope_node_key: {i}}}" for i, node in enumerate(NODES, 1)
    )
    local = 'ansible_connection: local\n    ansible_python_interpreter: "{{ ansible_playbook_python }}"'
    inventory.write_text(f"---\nall:\n  vars:\n    {local}\n  hosts:\n{hosts}\n")
    rule_dir = tmp_path / "rules"
    rule_dir.mkdir()
    plan = [{"type": "playbook", "playbook": a.split(":", 1)[1]} for a in ACTIONS]
    (rule_dir / "worn.yml").write_text(
        textwrap.dedent("""
        - rule_id: worn_ssd
          description: worn SSD (test)
          severity: critical
          level: L4
          message: "{{ node_id }} {{ device }} worn"
          trigger:
            - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 10m,
               aggregate: last}
        """)
        + f"  action: {json.dumps(plan)}\n"
    )
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    return inventory, rule_dir, secret


def worn_now(dsn: str) -> None:
    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for node in NODES:
            batch.append(
                node, "smart_reallocated_sector_ct", "sda", {}, 184.0 if node == SICK else 0.0, now_ms()
            )
        store.insert_metrics(batch)


class Serve:
    """`serve --execute` as a real process: its stdout lines (the head, then one JSON line a cycle)."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path):
        self.stderr = log.open("w")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env, cwd=TOP
        )
        assert self.proc.stdout is not None
        self.head = self.proc.stdout.readline()
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()  # type: ignore[arg-type]

    def cycles(self) -> list[dict]:
        return [json.loads(line) for line in list(self.lines) if line.startswith('{"event": "cycle"')]

    def kill_all(self) -> None:
        """SIGKILL serve and every process under it at once (stopped first, so none acts after)."""
        family = [self.proc.pid, *descendants(self.proc.pid)]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in family:
                with contextlib.suppress(ProcessLookupError):  # one that ended meanwhile
                    os.kill(pid, sig)
        self.proc.wait(30)
        self.stderr.close()
        time.sleep(0.5)  # its reader thread takes the last lines

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        self.stderr.close()


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def wait_for(what, seconds: float, why: str, serve: Serve | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(1)
    told = Path(serve.stderr.name).read_text()[-3000:] if serve else ""
    raise AssertionError(f"{why} within {seconds:g} s\n{told}")


def latest(dsn: str) -> dict[str, tuple[str, dict]]:
    with Store(dsn) as store:
        rows = store.query(
            "SELECT action, argMax(status, version), argMax(detail, version) "
            f"FROM {store.database}.actions WHERE target = {{n:String}} GROUP BY txn_id, finding_id, action",
            {"n": SICK},
        )
    return {action: (status, json.loads(detail)) for action, status, detail in rows}


@pytest.mark.parametrize("point", ["before_drain", "after_drain", "during_evidence", "during_ticket"])
def test_a_serve_killed_mid_incident_is_completed_by_its_successor_once(tmp_path, tmp_dsn, slurm, point):
    jira = StallingJira(stall=point == "during_ticket").start()
    crash_dir = tmp_path / "crash"
    crash_dir.mkdir()
    tools = wrappers(tmp_path / "bin", crash_dir)
    inventory, rule_dir, secret = lab(tmp_path)
    worn_now(tmp_dsn)
    evidence = tmp_path / "evidence"
    env = {
        **os.environ,
        **slurm.env,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "STETHOSCOPE_TICKET_USER": "bot",
        "STETHOSCOPE_TICKET_TOKEN": "t0ken",
        "STETHOSCOPE_LOCK_DIR": str(tmp_path / "locks"),
    }
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-model", "--no-sweep",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "2", "--rules", str(rule_dir),
        "--log-format", "json", "--execute",
        "-e", f"stethoscope_ticket_url={jira.url}", "-e", f"stethoscope_evidence_dir={evidence}",
        "-e", f"stethoscope_diagnose_log={tmp_path / 'findings.log'}", "-e", "ticket_timeout=120",
    ]  # fmt: skip
    started: list[Serve] = []
    try:
        first = Serve(command, {**env, "CRASH_POINT": point}, tmp_path / "first.log")
        started.append(first)
        assert "executing" in first.head, first.head
        wait_for(
            lambda: (crash_dir / "reached").exists() or jira.reached.is_set(),
            90,
            f"serve reached no {point}",
            first,
        )
        stalled_at = len(first.cycles())
        # the slow action holds no cycle up: the next ones run and log while it waits
        wait_for(lambda: len(first.cycles()) >= stalled_at + 2, 60, "no cycle ran beside the slow action")
        first.kill_all()
        jira.release.set()

        second = Serve(command, env, tmp_path / "second.log")
        started.append(second)
        assert "executing" in second.head and "standby" not in second.head, second.head

        def done() -> bool:
            ticketed = any(r.path.endswith("/comment") for r in list(jira.requests)) or any(
                len(issue["attachments"]) == 2 for issue in list(jira.issues.values())
            )
            bundled = any(evidence.glob(f"*/{SICK}.tar.gz"))
            return ticketed and bundled and "DRAIN" in slurm.node(SICK)["state"]

        wait_for(done, 150, "the incident was not completed after the restart", second)
        settled = len(second.cycles())
        wait_for(lambda: len(second.cycles()) > settled, 30, "no cycle after completion")
        second.stop()
    finally:
        jira.release.set()
        for serve in started:
            if serve.proc.poll() is None:  # a failed check leaves nothing running
                serve.kill_all()
        jira.stop()
    cycles = second.cycles()
    assert cycles[0]["executing"] and cycles[0]["standby"] is None  # acted at once: no heartbeat wait
    states = latest(tmp_dsn)
    assert {a: states[a][0] for a in ACTIONS} == dict.fromkeys(ACTIONS, "ok"), states
    assert len((crash_dir / "updates").read_text().splitlines()) == 1  # one drain Slurm took
    assert len(jira.issues) == 1
    # what was in flight at the kill was reconciled, and all that ran again ran in the first cycle
    in_flight = {
        "before_drain": ACTIONS[0],
        "after_drain": ACTIONS[0],
        "during_evidence": ACTIONS[1],
        "during_ticket": ACTIONS[2],
    }[point]
    said = json.dumps(states[in_flight][1])
    assert RECONCILED in said, said
    ran_before = {c["at"] for c in first.cycles()}
    tried_after = {
        a: s[1].get("tried_at") for a, s in states.items() if s[1].get("tried_at") not in ran_before
    }
    assert tried_after and set(tried_after.values()) <= {cycles[0]["at"], cycles[1]["at"]}, tried_after


@pytest.mark.parametrize(("point", "unstarted"), [("before_drain", 0), ("during_evidence", 1)])
def test_a_serve_killed_before_an_action_started_leaves_it_to_its_successor(
    tmp_path, tmp_dsn, slurm, point, unstarted
):
    """Regression: killed after its incident's findings were written but before an action's first
    row (the first action, or one between two steps), the action was never run: the successor found
    nothing in flight. Every action is on record as `planned`, naming its executor, before it is
    queued; the kill here is taken back to that moment (the stalled action's row made `planned`)."""
    jira = StallingJira(stall=False).start()
    crash_dir = tmp_path / "crash"
    crash_dir.mkdir()
    tools = wrappers(tmp_path / "bin", crash_dir)
    inventory, rule_dir, secret = lab(tmp_path)
    worn_now(tmp_dsn)
    evidence = tmp_path / "evidence"
    env = {
        **os.environ,
        **slurm.env,
        "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}",
        "STETHOSCOPE_TICKET_USER": "bot",
        "STETHOSCOPE_TICKET_TOKEN": "t0ken",
        "STETHOSCOPE_LOCK_DIR": str(tmp_path / "locks"),
    }
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-model", "--no-sweep",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "2", "--rules", str(rule_dir),
        "--log-format", "json", "--execute",
        "-e", f"stethoscope_ticket_url={jira.url}", "-e", f"stethoscope_evidence_dir={evidence}",
        "-e", f"stethoscope_diagnose_log={tmp_path / 'findings.log'}",
    ]  # fmt: skip
    started: list[Serve] = []
    try:
        first = Serve(command, {**env, "CRASH_POINT": point}, tmp_path / "first.log")
        started.append(first)
        wait_for(lambda: (crash_dir / "reached").exists(), 90, f"serve reached no {point}", first)
        first.kill_all()
        states = latest(tmp_dsn)
        assert [states[a][0] for a in ACTIONS[unstarted + 1 :]] == ["planned"] * (2 - unstarted), states
        status, detail = states[ACTIONS[unstarted]]
        assert status == "in_flight"
        with Store(tmp_dsn) as store:  # as if killed just before this action's in_flight row
            (row,) = store.query(
                f"SELECT txn_id, finding_id FROM {store.database}.actions WHERE action = {{a:String}} "
                "AND target = {n:String} LIMIT 1",
                {"a": ACTIONS[unstarted], "n": SICK},
            )
            store.insert_rows(
                "actions",
                [
                    {
                        "txn_id": row[0],
                        "finding_id": row[1],
                        "action": ACTIONS[unstarted],
                        "target": SICK,
                        "status": "planned",
                        "detail": json.dumps({"executor": detail["executor"]}),
                        "started_at": now_ms(),
                        "finished_at": None,
                        "version": now_ms() + 60_000,
                    }
                ],
            )
        if unstarted == 0:
            slurm.undrain_all()  # the stall was before Slurm took the drain: none in place

        second = Serve(command, env, tmp_path / "second.log")
        started.append(second)

        def done() -> bool:
            return all(s == "ok" for s, _ in (latest(tmp_dsn).get(a, ("", {})) for a in ACTIONS))

        wait_for(done, 150, "the incident was not completed after the restart", second)
        second.stop()
    finally:
        for serve in started:
            if serve.proc.poll() is None:
                serve.kill_all()
        jira.stop()
    assert len((crash_dir / "updates").read_text().splitlines()) == 1  # one drain Slurm took
    assert "DRAIN" in slurm.node(SICK)["state"] and len(jira.issues) == 1
    assert any(evidence.glob(f"*/{SICK}.tar.gz"))


def pool_running_a_drain():
    """A one-worker action pool whose worker is held in incident txn1's drain until `release` is set;
    `ran` lists what ran to its end."""
    from stethoscope.remediation.action_pool import ActionPool

    pool = ActionPool(1)
    running, release, ran = threading.Event(), threading.Event(), []

    def drain() -> None:
        running.set()
        release.wait(60)
        ran.append("drain")

    pool.submit("txn1", ["drain"], drain)
    return pool, running, release, ran


def test_on_stop_the_pool_drops_the_work_not_started_and_lets_the_running_work_finish():
    """Work queued but not started when serve stops is left to the successor (its `planned` rows)."""
    pool, running, release, ran = pool_running_a_drain()
    pool.submit("txn1", ["ticket"], lambda: ran.append("ticket"))
    assert running.wait(60)
    closing = threading.Thread(target=pool.close)
    closing.start()
    wait_for(lambda: pool.busy().get("txn1") == frozenset({"drain"}), 30, "the queued work was not dropped")
    release.set()
    closing.join(60)
    assert ran == ["drain"] and pool.pending() == 0


def test_an_incident_that_drains_starts_before_incidents_queued_earlier_that_do_not():
    """A node to isolate waits for no backlog of tickets and alerts: with every worker busy, the
    incident whose work drains is started first when a worker frees, then the others in their order."""
    pool, running, release, ran = pool_running_a_drain()
    assert running.wait(60)
    pool.submit("ticket-a", ["ticket"], lambda: ran.append("ticket-a"))
    pool.submit("ticket-b", ["alert"], lambda: ran.append("ticket-b"))
    pool.submit("drain-c", ["drain", "ticket"], lambda: ran.append("drain-c"), first=True)
    release.set()
    wait_for(lambda: pool.pending() == 0, 30, "the queued work did not run")
    assert ran == ["drain", "drain-c", "ticket-a", "ticket-b"]


def test_a_drain_added_to_an_incident_still_waiting_moves_it_ahead():
    """An incident queued for a ticket, still waiting for a worker, whose next cycle plans a drain
    (a critical finding joined it) goes ahead of the incidents queued before it, as a new one would."""
    pool, running, release, ran = pool_running_a_drain()
    assert running.wait(60)
    pool.submit("ticket-a", ["ticket"], lambda: ran.append("ticket-a"))
    pool.submit("joined-b", ["ticket"], lambda: ran.append("joined-b ticket"))
    pool.submit("joined-b", ["drain"], lambda: ran.append("joined-b drain"), first=True)
    release.set()
    wait_for(lambda: pool.pending() == 0, 30, "the queued work did not run")
    assert ran == ["drain", "joined-b ticket", "joined-b drain", "ticket-a"]


def test_on_stop_incidents_still_waiting_for_a_worker_are_dropped_too():
    """With every worker busy, an incident no worker took yet is not run on the way out: its `planned`
    rows are the successor's, and serve stops without working through a backlog."""
    pool, running, release, ran = pool_running_a_drain()
    pool.submit("txn2", ["ticket"], lambda: ran.append("txn2"))
    assert running.wait(60)
    closing = threading.Thread(target=pool.close)
    closing.start()
    wait_for(lambda: "txn2" not in pool.busy(), 30, "the waiting incident was not dropped")
    release.set()
    closing.join(60)
    assert ran == ["drain"] and pool.pending() == 0
