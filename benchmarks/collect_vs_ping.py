#!/usr/bin/env python3
"""Collection cost: collect.yml over an N-node lab against `ansible -m ping` over the same nodes, in one
run, alternating. Target: collect.yml <= 1.3x ping's wall time on 64 nodes (`met` says whether this run
met it). The lab's nodes run on this machine, so their modules' work counts in collect.yml's time and
ping's does not; the load average at the start and the end is recorded. `--reference` times another
sweep playbook in the same run: benchmarks/collect_two_tasks.yml is collect.yml as it ran before the
one-module sweep; `--reference-checkout DIR` times DIR's collect.yml with DIR's collection (another
checkout of the repository, after `make setup` there: an older commit's modules against this one's).
The reference's rows go to a database of their own: `rows_stored` counts collect.yml's only. Each
command's CPU time (its processes', the lab's modules included) is recorded beside its wall time.

    .venv/bin/python benchmarks/collect_vs_ping.py [--nodes 64] [--repeat 3] \
        [--reference benchmarks/collect_two_tasks.yml | --reference-checkout DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_results

from stethoscope import stats

TOP = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TARGET = 1.3  # collect.yml's wall time over ping's


def timed(command: list[str], env: dict[str, str], cwd: Path = TOP) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command's processes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _commit(checkout: Path) -> str:
    head = ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"]
    return subprocess.run(head, capture_output=True, text=True, check=True).stdout.strip()


def ratio(medians: dict[str, float], name: str) -> float:
    return round(medians[name] / medians["ping"], 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--reference",
        type=Path,
        help="another sweep playbook timed in the same run, alternating (benchmarks/collect_two_tasks.yml)",
    )
    parser.add_argument(
        "--reference-checkout",
        type=Path,
        help="another checkout (after `make setup`): its collect.yml and collection, timed alternating",
    )
    parser.add_argument("--out", type=Path, default=None, help="default results/collect_vs_ping_<nodes>.json")
    args = parser.parse_args()
    if args.reference and args.reference_checkout:
        parser.error("--reference and --reference-checkout: one reference a run")
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
        runs = {"ping": (ping, env, TOP), "collect": (collect, env, TOP)}
        # the same lab (each sweep advances it), another database: rows_stored stays collect.yml's
        reference_env = {**env, "STETHOSCOPE_DSN": f"chdb://{tmp_path / 'db_reference'}"}
        if args.reference:
            runs["reference"] = ([*collect[:-1], str(args.reference.resolve())], reference_env, TOP)
        if args.reference_checkout:
            other = args.reference_checkout.resolve()
            reference_env["ANSIBLE_CONFIG"] = str(other / "ansible.cfg")
            runs["reference"] = ([*collect[:-1], str(other / "playbooks/collect.yml")], reference_env, other)
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpu: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, (command, command_env, cwd) in runs.items():
                wall, used = timed(command, command_env, cwd)
                times[name].append(wall)
                cpu[name].append(used)
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
        "cpu_seconds_median": {k: round(stats.median(vs), 2) for k, vs in cpu.items()},
        "collect_vs_ping": ratio(medians, "collect"),
        "target": f"collect <= {TARGET}x ping",
        "met": ratio(medians, "collect") <= TARGET,
        **(
            {
                "reference": str(args.reference or args.reference_checkout),
                **({"reference_commit": _commit(args.reference_checkout)} if args.reference_checkout else {}),
                "reference_vs_ping": ratio(medians, "reference"),
            }
            if "reference" in runs
            else {}
        ),
        "rows_stored": rows,
        "nodes_stored": nodes,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(figures, indent=1))
    write_results(args.out or TOP / f"benchmarks/results/collect_vs_ping_{args.nodes}.json", figures)


if __name__ == "__main__":
    main()
