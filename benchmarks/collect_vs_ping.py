#!/usr/bin/env python3
"""Collection cost: collect.yml over an N-node lab against `ansible -m ping` over the same nodes, in one
run, alternating. Target (issue 2): collect.yml <= 2x ping's wall time on 64 nodes.

    .venv/bin/python benchmarks/collect_vs_ping.py [--nodes 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_results

from stethoscope import stats

TOP = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/collect_vs_ping_64.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        inventory = tmp_path / "inventory" / "hosts.yml"
        env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "ANSIBLE_CONFIG": str(TOP / "ansible.cfg"),
            "STETHOSCOPE_LAB_DIR": str(tmp_path / "lab"),
            "STETHOSCOPE_DSN": f"chdb://{tmp_path / 'db'}",
            "STETHOSCOPE_SPOOL_DIR": str(tmp_path / "spool"),
        }
        subprocess.run(
            [
                sys.executable,
                str(TOP / "tools/lab.py"),
                "build",
                "--nodes",
                str(args.nodes),
                "--inventory",
                str(inventory),
            ],
            env=env,
            check=True,
            capture_output=True,
        )
        ping = [str(BIN / "ansible"), "all", "-i", str(inventory), "-m", "ansible.builtin.ping"]
        collect = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(TOP / "playbooks/collect.yml")]
        timed(ping, env)  # warm caches once (plugin loading, bytecode)
        times: dict[str, list[float]] = {"ping": [], "collect": []}
        for _ in range(args.repeat):
            times["ping"].append(timed(ping, env))
            times["collect"].append(timed(collect, env))
        from stethoscope.store.client import Store

        with Store(env["STETHOSCOPE_DSN"]) as store:
            rows, nodes = store.query("SELECT count(), uniqExact(node_id) FROM stethoscope.metrics")[0]
    medians = {name: stats.median(values) for name, values in times.items()}
    figures = {
        "nodes": args.nodes,
        "forks": 16,
        "repeat": args.repeat,
        "seconds_median": {k: round(v, 2) for k, v in medians.items()},
        "seconds_all": {k: [round(v, 2) for v in vs] for k, vs in times.items()},
        "collect_vs_ping": round(medians["collect"] / medians["ping"], 2),
        "rows_stored": rows,
        "nodes_stored": nodes,
        "target": "collect <= 2x ping",
    }
    print(json.dumps(figures, indent=1))
    write_results(args.out, figures)


if __name__ == "__main__":
    main()
