#!/usr/bin/env python3
"""`stethoscope baseline` and `verify --node` at fleet scale: N nodes x 5 suites x 30 runs of history
(3 repetitions each) generated into embedded ClickHouse (INSERT ... SELECT from numbers()), 10 hardware
classes, every 97th node 30 % slow. Targets: the whole report <= 2 s and one node's verify
<= 0.5 s on a 2-core machine. The old implementation (commit 208f04c, which loaded all of
`bench_results FINAL` into Python, also to verify one node) is timed on the same data in the same run,
imported from `git show 208f04c:stethoscope/bench/baseline.py`.

    .venv/bin/python benchmarks/baseline_scale.py [--nodes 2000] [--runs 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_results

from stethoscope.bench import baseline
from stethoscope.catalog import Catalog
from stethoscope.paths import project_root
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

OLD_COMMIT = "208f04c"
SUITES = [  # (suite, metric, labels, healthy value)
    ("compute", "bench_gemm_tflops", "map('dtype', 'bf16', 'mode', 'burst')", 760.0),
    ("fft", "bench_fft_ms", "map('dtype', 'c64')", 1.5),
    ("nccl", "bench_allreduce_busbw_gb_per_s", "map('algo', 'ring', 'size', 'avg')", 180.0),
    ("storage", "bench_fio_randread_iops", "map()", 900000.0),
    ("network", "bench_rdma_bw_gbit_per_s", "map()", 390.0),
]
CLASSES = 10
SLOW_EVERY = 97
DAY_MS = 86_400_000


def generate(store: Store, nodes: int, runs: int) -> int:
    start = now_ms() - runs * DAY_MS
    for suite, metric, labels, healthy in SUITES:
        worse = 0.7 if metric != "bench_fft_ms" else 1.3
        store.command(
            f"INSERT INTO {store.database}.bench_results (run_id, node_id, suite, metric_name, device, "
            "labels, value, unit, repetition, class_fingerprint, node_fingerprint, unstable, timestamp) "
            "SELECT concat('run', toString(r.number), '-', node_id) AS run_id, "
            "concat('node', leftPad(toString(n.number), 4, '0')) AS node_id, "
            f"'{suite}', '{metric}', 'gpu0', {labels}, "
            f"{healthy} * if(n.number % {SLOW_EVERY} = 0 AND r.number = {runs - 1}, {worse}, 1) "
            "* (1 + (sipHash64(n.number, r.number, k.number) % 1000 - 500) / 50000.0) AS value, "
            f"'', toUInt16(k.number + 1), concat('class', toString(n.number % {CLASSES})), "
            "concat('nfp', toString(n.number)), 0, "
            f"fromUnixTimestamp64Milli(toInt64({start} + r.number * {DAY_MS} + n.number * 10), 'UTC') "
            f"FROM numbers({nodes}) AS n CROSS JOIN numbers({runs}) AS r CROSS JOIN numbers(3) AS k "
            "SETTINGS max_insert_threads = 2"
        )
    return store.query(f"SELECT count() FROM {store.database}.bench_results")[0][0]


def old_module():
    source = subprocess.run(
        ["git", "show", f"{OLD_COMMIT}:stethoscope/bench/baseline.py"],
        cwd=project_root(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_208f04c.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_208f04c", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


CPU: dict[str, float] = {}


def timed(fn, repeat: int, label: str = "") -> tuple[float, object]:
    """Median wall seconds; the process's CPU seconds (chdb runs in it) of the median go to CPU."""
    times, cpus, result = [], [], None
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        result = fn()
        times.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    CPU[label] = round(statistics.median(cpus), 3)
    return statistics.median(times), result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=project_root() / "benchmarks/results/baseline_scale.json")
    args = parser.parse_args()
    catalog = Catalog.load()
    old = old_module()
    node = "node0097"  # one of the slow ones
    with tempfile.TemporaryDirectory() as tmp, Store(f"chdb://{tmp}/db") as store:
        store.init_schema()
        started = time.perf_counter()
        rows = generate(store, args.nodes, args.runs)
        generated_s = time.perf_counter() - started
        store.command(f"OPTIMIZE TABLE {store.database}.bench_results FINAL")
        since = now_ms() - DAY_MS - 3_600_000

        def new_report() -> int:
            built = baseline.build(store, catalog)
            return len(baseline.render_table(baseline.summary_rows(built)).splitlines())

        def old_report() -> int:
            built = old.build(store, catalog)
            return len(old.render_table(old.summary_rows(built)).splitlines())

        def new_verify() -> dict:
            return baseline.verify(store, catalog, node, since, now_ms())

        def old_verify() -> list:  # what verify_command did at 208f04c: build everything, keep one node
            store.query(
                f"SELECT toUnixTimestamp64Milli(max(timestamp)), count() FROM {store.database}.bench_results "
                "WHERE node_id = {node:String}",
                {"node": node},
            )
            return [r for r in old.build(store, catalog) if r.node_id == node]

        load_before = os.getloadavg()[0]
        new_report_s, new_lines = timed(new_report, args.repeat, "baseline_report_new")
        new_verify_s, verdict = timed(new_verify, args.repeat, "verify_node_new")
        old_report_s, old_lines = timed(old_report, 1, f"baseline_report_old_{OLD_COMMIT}")
        old_verify_s, old_rows = timed(old_verify, 1, f"verify_node_old_{OLD_COMMIT}")
    assert isinstance(verdict, dict)
    report = {
        "nodes": args.nodes,
        "suites": len(SUITES),
        "runs": args.runs,
        "repetitions": 3,
        "bench_results_rows": rows,
        "generate_seconds": round(generated_s, 2),
        "baseline_report_seconds": {
            "new": round(new_report_s, 3),
            f"old_{OLD_COMMIT}": round(old_report_s, 3),
        },
        "verify_node_seconds": {"new": round(new_verify_s, 3), f"old_{OLD_COMMIT}": round(old_verify_s, 3)},
        "targets_seconds": {"baseline_report": 2.0, "verify_node": 0.5},
        # the machine is shared (other processes run): its load and the CPU seconds this one used
        "load_average_1m_at_start": round(load_before, 2),
        "cpu_seconds": CPU,
        "report_lines": {"new": new_lines, f"old_{OLD_COMMIT}": old_lines},
        "verify_example": {
            "node": node,
            "green": verdict["green"],
            "references": sorted({c.reference for c in verdict["checks"]}),
            "grades": sorted(c.grade for c in verdict["checks"]),
            "old_rows": len(old_rows),  # type: ignore[arg-type]
        },
        "repeat": args.repeat,
    }
    write_results(args.out, report, indent=2)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
