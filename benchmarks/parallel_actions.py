#!/usr/bin/env python3
"""Parallel remediation: `diagnose --execute` draining N findings' nodes (real drain.yml, real
slurmctld from tools/slurm_lab.py) with stethoscope_executor_parallel=1 against the default 4, the
breaker opened to let every drain through. Wall time of the whole run, from the CLI.

    .venv/bin/python benchmarks/parallel_actions.py [--findings 8] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOP / "tools"))

from provenance import write_results  # noqa: E402
from slurm_lab import SlurmCluster  # noqa: E402  (a tool beside the project, not a package)

from stethoscope.store.batch import MetricColumns  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.timeutil import now_ms  # noqa: E402

RULE = """
- rule_id: worn_ssd
  description: worn SSD (benchmark)
  severity: critical
  trigger:
    - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 5m, aggregate: last}
  action: [{type: playbook, playbook: remediate/drain.yml}]
"""


def one_run(root: Path, slurm: SlurmCluster, nodes: list[str], parallel: int) -> float:
    slurm.undrain_all()
    dsn = f"chdb://{root / f'db-{parallel}-{time.monotonic_ns()}'}"
    at = now_ms() - 5_000
    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for node in nodes:
            batch.append(node, "smart_reallocated_sector_ct", "sda", {}, 184.0, at)
        store.insert_metrics(batch)
    inventory = root / "hosts.yml"
    hosts = "\n".join(f"        {n}: {{slurm_name: {n}}}" for n in nodes)
    inventory.write_text(
        f"all:\n  vars:\n    ansible_connection: local\n  children:\n    gpu_nodes:\n      hosts:\n{hosts}\n"
    )
    (root / "rules.yml").write_text(textwrap.dedent(RULE))
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(root / "spool"), "diagnose",
        "--json", "--rules", str(root / "rules.yml"), "--at", str(at / 1000), "--execute",
        "--inventory", str(inventory), "-e", "stethoscope_breaker_fraction=1.0",
        "-e", f"stethoscope_executor_parallel={parallel}", "-e", f"stethoscope_diagnose_log={root / 'log'}",
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=TOP, capture_output=True, text=True, env={**os.environ, **slurm.env})
    elapsed = time.perf_counter() - started
    outcomes = {f["outcome"] for f in json.loads(done.stdout)}
    if outcomes != {"playbook:remediate/drain.yml ok"}:
        raise SystemExit(f"unexpected outcomes {outcomes}: {done.stderr[-2000:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--findings", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/parallel_actions.json")
    args = parser.parse_args()
    nodes = [f"node{i:02d}" for i in range(1, args.findings + 1)]
    with tempfile.TemporaryDirectory(prefix="stethoscope-bench-", ignore_cleanup_errors=True) as tmp:
        root = Path(tmp)
        slurm = SlurmCluster(root / "slurm", nodes=f"node[01-{args.findings:02d}]").start()
        try:
            times: dict[int, list[float]] = {1: [], 4: []}
            for _ in range(args.repeat):
                for parallel in (1, 4):
                    times[parallel].append(one_run(root, slurm, nodes, parallel))
        finally:
            slurm.stop()
    result = {
        "findings": args.findings,
        "sequential_s": round(statistics.median(times[1]), 1),
        "parallel4_s": round(statistics.median(times[4]), 1),
        "median_of": args.repeat,
    }
    result["speedup"] = round(result["sequential_s"] / result["parallel4_s"], 2)
    print(json.dumps(result))
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
