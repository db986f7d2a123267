#!/usr/bin/env python3
"""`stethoscope serve` on a 64-node lab with sweeps every 120 s for 10 minutes:
every sweep stored, the diagnosis cycle's p99 under the sweep interval, no overlapping sweeps.

serve runs as it would on a controller: the inventory (64 lab nodes, each with its stream key,
`stethoscope_sweep_interval: 120`), the embedded database held by serve, the sweeps through
ansible-runner writing through the spool serve replays, the cycle every 60 s with the shipped rules
and the model, the board each cycle, one JSON log line per cycle. Reported: sweeps run / failed /
skipped and each one's seconds, the sweeps each node has stored, the cycles' p50/p99/max seconds.

    .venv/bin/python benchmarks/serve_lab64.py [--nodes 64] [--minutes 10] [--sweep-interval 120]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP / "benchmarks"))

from provenance import stamp, write_results  # noqa: E402

from stethoscope.store.client import Store  # noqa: E402


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def build_lab(tmp: Path, nodes: int, sweep_interval: int, env: dict[str, str]) -> Path:
    inventory = tmp / "inventory" / "hosts.yml"
    subprocess.run(
        [
            sys.executable,
            str(TOP / "tools/lab.py"),
            "build",
            "--nodes",
            str(nodes),
            "--inventory",
            str(inventory),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    host_vars = inventory.parent / "host_vars"
    host_vars.mkdir(exist_ok=True)
    for number in range(1, nodes + 1):  # each node's key on the stream
        (host_vars / f"node{number:02d}.yml").write_text(f"---\nstethoscope_node_key: {number}\n")
    with (inventory.parent / "group_vars" / "all.yml").open("a") as settings:
        settings.write(f"stethoscope_sweep_interval: {sweep_interval}\n")
    return inventory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--sweep-interval", type=int, default=120)
    parser.add_argument("--interval", type=float, default=60, help="seconds between diagnosis cycles")
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/serve_lab64.json")
    args = parser.parse_args()
    provenance = stamp()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        env = {
            **os.environ,
            "STETHOSCOPE_LAB_DIR": str(tmp / "lab"),
            "STETHOSCOPE_HOME": str(tmp / "home"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        inventory = build_lab(tmp, args.nodes, args.sweep_interval, env)
        secret = tmp / "cluster.secret"
        secret.write_text("serve-benchmark-secret-0123456789\n")
        dsn = f"chdb://{tmp / 'db'}"
        command = [
            sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(tmp / "spool"),
            "serve", "--inventory", str(inventory), "--secret-file", str(secret),
            "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", str(args.interval),
            "--log-format", "json",
        ]  # fmt: skip
        subprocess.run(
            [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "db", "init"],
            env=env,
            check=True,
            capture_output=True,
        )
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp
        )
        assert proc.stdout is not None
        head = proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz", head)
        if not match:
            raise SystemExit(f"serve did not start: {head}{proc.stderr.read() if proc.stderr else ''}")
        http = match[1]
        lines: list[str] = []
        threading.Thread(target=lambda: lines.extend(proc.stdout or []), daemon=True).start()
        # drained, so that serve never blocks writing to a full pipe
        threading.Thread(target=lambda: list(proc.stderr or []), daemon=True).start()
        sweep_seconds: list[float] = []
        seen_finish = None
        deadline = time.monotonic() + args.minutes * 60
        health: dict = {}
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{http}/healthz", timeout=30) as response:
                health = json.loads(response.read())
            sweeps = health.get("sweeps", {})
            if (
                sweeps.get("last_seconds") is not None
                and sweeps.get("ok", 0) + sweeps.get("failed", 0) != seen_finish
            ):
                seen_finish = sweeps.get("ok", 0) + sweeps.get("failed", 0)
                sweep_seconds.append(sweeps["last_seconds"])
            time.sleep(2)
        # let a sweep under way end and be stored before stopping
        while health.get("sweeps", {}).get("running"):
            time.sleep(2)
            with urllib.request.urlopen(f"{http}/healthz", timeout=30) as response:
                health = json.loads(response.read())
        time.sleep(3)  # the spool is replayed within the second
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)
        records = [json.loads(line) for line in lines if line.startswith("{")]
        with Store(dsn) as store:
            per_node = store.query(
                # every sweep stores each node's fingerprint count (collect.yml's first task)
                f"SELECT node_id, uniqExact(timestamp) FROM {store.database}.metrics "
                "WHERE metric_name = 'node_fingerprint_changes_total' GROUP BY node_id"
            )
    cycles = [r["seconds"] for r in records if r.get("ok")]
    sweeps = health.get("sweeps", {})
    run = sweeps.get("ok", 0) + sweeps.get("failed", 0)
    stored = sorted(count for _node, count in per_node)
    result = {
        "target": "every sweep stored, cycle p99 under the sweep interval, no overlapping sweeps",
        "nodes": args.nodes,
        "minutes": args.minutes,
        "sweep_interval_s": args.sweep_interval,
        "cycle_interval_s": args.interval,
        "sweeps": {
            "run": run,
            "ok": sweeps.get("ok"),
            "failed": sweeps.get("failed"),
            "skipped": sweeps.get("skipped"),
        },
        "sweep_seconds": [round(s, 1) for s in sweep_seconds],
        "sweeps_stored_per_node": {"min": stored[0] if stored else 0, "max": stored[-1] if stored else 0},
        "nodes_stored": len(stored),
        "cycles": len(cycles),
        "cycle_failures": sum(1 for r in records if not r.get("ok")),
        "cycle_seconds": {
            "p50": round(statistics.median(cycles), 2) if cycles else None,
            "p99": round(nearest_rank(cycles, 0.99), 2) if cycles else None,
            "max": round(max(cycles), 2) if cycles else None,
        },
    }
    result["met"] = bool(
        run
        and stored
        and stored[0] >= run
        and len(stored) == args.nodes
        and sweeps.get("skipped") == 0
        and result["cycle_seconds"]["p99"] is not None
        and result["cycle_seconds"]["p99"] < args.sweep_interval
    )
    print(json.dumps(result, indent=1))
    write_results(args.out, result, provenance)


if __name__ == "__main__":
    main()
