#!/usr/bin/env python3
"""Read commands beside a running `serve` (the target: every read command answers in <= 2 s,
p95 of 50 calls, and never exits 3 for a lock).

serve runs on the lab as on a controller (the embedded database held by serve, its own sweeps of
collect.yml, a diagnosis cycle every interval); once its first sweep is stored, each read command runs
`--calls` times as the operator runs it (a new `stethoscope` process each call, which reaches the
store through serve's relay), the commands interleaved, the rounds spread over at least `--spread`
seconds (so that reads land while serve sweeps, evaluates and acts, however fast they are). Reported
per command: p50/p95/max seconds of the whole call (process start included), its exit codes, calls
that exited 3 or printed a lock error; and, as the reference, the same commands run directly on the
database after serve stopped.

With `--execute`, serve acts (a real slurmctld from tools/slurm_lab.py holds the lab's nodes, a
loopback Jira stand-in takes the tickets), so the reads run while its first executing cycles drain,
bundle evidence and ticket the lab's faults. Once its actions have settled (no action for two cycles),
`--inject NODE` starts an XID 79 on that healthy node (`tools/lab.py inject`), as a GPU that falls
off the bus between sweeps, and the seconds from then to the node's drain in Slurm and to its ticket
are reported (the target: both within 5 minutes, with sweeps every 120 s and cycles every 60 s).

    .venv/bin/python benchmarks/serve_relay_reads.py [--nodes 16] [--calls 50] [--direct-calls 5]
        [--execute [--inject node09]]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP / "benchmarks"))
sys.path.insert(0, str(TOP / "tools"))
sys.path.insert(0, str(TOP / "tests" / "helpers"))

from http_standin import StandIn  # noqa: E402  (the tests' loopback Jira)
from provenance import stamp, write_results  # noqa: E402
from serve_lab64 import build_lab, nearest_rank  # noqa: E402
from slurm_lab import SlurmCluster  # noqa: E402

from stethoscope.remediation.ledger import DRAIN  # noqa: E402

READS = {
    "summary": ["summary"],
    "incidents": ["incidents"],
    "actions": ["actions"],
    "top": ["top", "gpu_temperature_celsius"],
    "diagnose": ["diagnose", "--json"],
}
TARGET_P95_SECONDS = 2.0
TARGET_FAULT_SECONDS = 300
LOCKED = ("Cannot lock", "in use by another process")


def call(cli: list[str], args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, bool, bool]:
    """Seconds, exit code, whether it met a lock, whether it printed serve's published evaluation."""
    started = time.monotonic()
    result = subprocess.run([*cli, *args], capture_output=True, text=True, env=env, cwd=cwd, check=False)
    locked = any(word in result.stderr for word in LOCKED)
    return time.monotonic() - started, result.returncode, locked, "serve's evaluation of" in result.stderr


def figures(samples: list[tuple[float, int, bool, bool]]) -> dict[str, object]:
    seconds = [s for s, _, _, _ in samples]
    return {
        "calls": len(samples),
        "p50_seconds": round(nearest_rank(seconds, 0.50), 3),
        "p95_seconds": round(nearest_rank(seconds, 0.95), 3),
        "max_seconds": round(max(seconds), 3),
        "exit_codes": dict(Counter(str(rc) for _, rc, _, _ in samples)),
        "exit_3": sum(1 for _, rc, _, _ in samples if rc == 3),
        "lock_errors": sum(1 for _, _, locked, _ in samples if locked),
        "from_serves_evaluation": sum(1 for *_, published in samples if published),
    }


def health(http: str) -> dict:
    with urllib.request.urlopen(f"{http}/healthz", timeout=30) as response:
        return json.loads(response.read())


def actions(lines: list[str]) -> list[dict]:
    records = (json.loads(line) for line in list(lines) if line.startswith("{"))
    return [record for record in records if record.get("event") == "action"]


def settle(lines: list[str], interval: float, limit: float) -> float:
    """Seconds until serve logged no action for two cycles (its first executing backlog done); -1 when
    it did not within `limit` seconds."""
    started, seen, quiet_since = time.monotonic(), -1, time.monotonic()
    while time.monotonic() - started < limit:
        count = len(actions(lines))
        if count != seen:
            seen, quiet_since = count, time.monotonic()
        elif count and time.monotonic() - quiet_since >= 2 * interval:
            return round(quiet_since - started, 1)
        time.sleep(2)
    return -1.0


def fault_to_ticket(env: dict[str, str], node: str, slurm: SlurmCluster, jira: StandIn) -> dict[str, object]:
    """Inject an XID 79 on `node` and time its drain in Slurm and its ticket."""
    subprocess.run([sys.executable, str(TOP / "tools/lab.py"), "inject", node, "xid_79"], env=env, check=True)
    injected, drained, ticketed = time.monotonic(), None, None
    while time.monotonic() - injected < 3 * TARGET_FAULT_SECONDS and (drained is None or ticketed is None):
        if drained is None and "DRAIN" in slurm.node(node)["state"]:
            drained = time.monotonic() - injected
        issues = [f"{issue.get('summary')} {issue.get('labels')}" for issue in list(jira.issues.values())]
        if ticketed is None and any(node in issue and "gpu_xid_79" in issue for issue in issues):
            ticketed = time.monotonic() - injected
        time.sleep(1)
    return {
        "node": node,
        "fault": "xid_79",
        "seconds_to_drain": round(drained, 1) if drained is not None else None,
        "seconds_to_ticket": round(ticketed, 1) if ticketed is not None else None,
        "target_seconds": TARGET_FAULT_SECONDS,
        "target_met": drained is not None
        and ticketed is not None
        and max(drained, ticketed) <= TARGET_FAULT_SECONDS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--direct-calls", type=int, default=5, help="per command, after serve stopped")
    parser.add_argument(
        "--spread",
        type=float,
        default=300.0,
        help="seconds each command's calls are spread over at least (default 300: reads fast enough "
        "to end before serve's next sweep would measure a quiet controller)",
    )
    parser.add_argument("--sweep-interval", type=int, default=120)
    parser.add_argument("--interval", type=float, default=60, help="seconds between diagnosis cycles")
    parser.add_argument("--execute", action="store_true", help="serve acts (real slurmctld, Jira stand-in)")
    parser.add_argument(
        "--breaker-fraction",
        type=float,
        default=0.5,
        help="with --execute: room for the lab's own faults (the lab repeats 6 faulty nodes in 8)",
    )
    parser.add_argument("--inject", metavar="NODE", help="with --execute: an XID 79 on this healthy node")
    parser.add_argument(
        "--settle-limit",
        type=float,
        default=600,
        help="seconds to wait for serve's actions to settle before injecting (the lab's counters keep "
        "growing, so new findings keep coming: it injects anyway after this)",
    )
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/serve_relay_reads.json")
    args = parser.parse_args()
    if args.inject and not args.execute:
        parser.error("--inject needs --execute")
    provenance = stamp()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        env = {
            **os.environ,
            "STETHOSCOPE_LAB_DIR": str(tmp / "lab"),
            "STETHOSCOPE_HOME": str(tmp / "home"),
            "STETHOSCOPE_OPEN_WAIT": "30",  # the default: a call that waited for the lock would show
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        inventory = build_lab(tmp, args.nodes, args.sweep_interval, env)
        secret = tmp / "cluster.secret"
        secret.write_text("serve-benchmark-secret-0123456789\n")
        dsn = f"chdb://{tmp / 'db'}"
        cli = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(tmp / "spool")]
        subprocess.run([*cli, "db", "init"], env=env, check=True, capture_output=True)
        serve = [
            *cli, "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--listen",
            "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", str(args.interval), "--log-format", "json",
        ]  # fmt: skip
        slurm = jira = None
        if args.execute:
            slurm = SlurmCluster(tmp / "slurm", nodes=f"node[01-{args.nodes:02d}]").start()
            jira = StandIn().start()
            env.update(slurm.env)
            env.update(STETHOSCOPE_TICKET_USER="bot", STETHOSCOPE_TICKET_TOKEN="t0ken")
            env["STETHOSCOPE_LOCK_DIR"] = str(tmp / "locks")
            serve += [
                "--execute", "-e", f"stethoscope_ticket_url={jira.url}",
                "-e", f"stethoscope_evidence_dir={tmp / 'evidence'}",
                "-e", f"stethoscope_diagnose_log={tmp / 'findings.log'}",
                "-e", f"stethoscope_breaker_fraction={args.breaker_fraction}",
            ]  # fmt: skip
        proc = subprocess.Popen(
            serve, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp
        )
        assert proc.stdout is not None
        head = proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz", head)
        if not match:
            raise SystemExit(f"serve did not start: {head}{proc.stderr.read() if proc.stderr else ''}")
        http = match[1]
        lines: list[str] = []  # its cycles (stdout)
        said: list[str] = []  # its action lines (stderr), drained so that serve never blocks writing them
        threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True).start()
        threading.Thread(target=lambda: said.extend(proc.stderr or []), daemon=True).start()
        started = time.monotonic()
        while health(http).get("sweeps", {}).get("ok", 0) < 1:  # the lab's data stored
            if time.monotonic() - started > 600 or proc.poll() is not None:
                raise SystemExit("serve's first sweep did not end within 10 minutes")
            time.sleep(2)
        reads_env = {**env, "STETHOSCOPE_INVENTORY": str(inventory)}  # as README's operator sets it
        measure_started = time.monotonic()
        beside: dict[str, list[tuple[float, int, bool, bool]]] = {name: [] for name in READS}
        for round_ in range(args.calls):
            time.sleep(max(0.0, measure_started + round_ * args.spread / args.calls - time.monotonic()))
            for name, words in READS.items():
                beside[name].append(call(cli, words, reads_env, tmp))
        measured_seconds = time.monotonic() - measure_started
        fault: dict[str, object] | None = None
        settled = None
        if slurm is not None and jira is not None:
            settled = settle(said, args.interval, args.settle_limit)
            if args.inject:
                fault = fault_to_ticket(env, args.inject, slurm, jira)
        last = health(http)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
        drains = [r for r in actions(said) if r.get("action") == DRAIN]
        tickets = len(jira.issues) if jira else 0
        if jira:
            jira.stop()
        if slurm:
            slurm.stop()
        direct: dict[str, list[tuple[float, int, bool, bool]]] = {name: [] for name in READS}
        for _ in range(args.direct_calls):
            for name, words in READS.items():
                direct[name].append(call(cli, words, reads_env, tmp))
    cycles = [json.loads(line) for line in lines if line.startswith("{")]
    results = {
        "nodes": args.nodes,
        "serve_mode": "execute" if args.execute else "dry-run",
        "calls_per_command": args.calls,
        "target_p95_seconds": TARGET_P95_SECONDS,
        "beside_serve": {name: figures(samples) for name, samples in beside.items()},
        "direct_after_serve_stopped": {name: figures(samples) for name, samples in direct.items()},
        "target_met": all(
            f["p95_seconds"] <= TARGET_P95_SECONDS and f["exit_3"] == 0 and f["lock_errors"] == 0
            for f in (figures(samples) for samples in beside.values())
        ),
        "never_exit_3_nor_lock": all(
            figures(samples)["exit_3"] == 0 and figures(samples)["lock_errors"] == 0
            for samples in beside.values()
        ),
        "measured_seconds": round(measured_seconds, 1),
        "spread_seconds": args.spread,
        "serve_cycles_meanwhile": sum(1 for r in cycles if r.get("event") == "cycle"),
        "serve_sweeps": last.get("sweeps"),
    }
    if args.execute:
        results.update(
            breaker_fraction=args.breaker_fraction,
            actions_logged=len(actions(said)),
            # why a sweep failed: serve says it on stderr (its /healthz keeps only the last error)
            sweep_warnings=[line.strip()[:300] for line in said if "sweep:" in line][:20],
            drain_actions_logged=len(drains),
            tickets_opened=tickets,
            seconds_until_actions_settled=settled,
            fault_injected=fault,
        )
    write_results(args.out, results, provenance)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
