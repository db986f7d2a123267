#!/usr/bin/env python3
"""The learned diagnosis's input for a whole fleet: `features.read_windows` for N nodes x 10 minutes of
5-second stream rows in embedded ClickHouse, timed (docs/design.md "Learned diagnosis"). Target:
features + both graphs + explanation <= 2 s for 2,000 nodes on a 2-core machine, so the
features should take about 1.2 s or less.

The store holds what a streaming fleet writes: per node and 5-s period the node part (20 slots,
device "node"), and unless --no-gpu-parts the 8 GPU parts (14 slots each, device gpuN, the rows the
read must skip), and one rank's job part (6 slots, device "job"); every 60 s the sweep's rows (per
GPU, the drive, the AER/IB counters); 12 minutes of it, and a class fingerprint per node. A share of
the nodes (--swept-share, 5 %) streams nothing: their windows come from the sweep. Rows are generated
inside ClickHouse (INSERT ... SELECT from numbers()).

    .venv/bin/python benchmarks/features_read.py [--nodes 2000] [--repeat 5] [--no-gpu-parts]
        [--swept-share 0.05] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.model import features  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.telemetry.metric_set import load_sets  # noqa: E402
from stethoscope.timeutil import now_ms  # noqa: E402

MINUTES = 12
STEP_MS = 5000
SWEPT_GPU = ["gpu_temperature_celsius", "gpu_power_watts", "gpu_sm_clock_mhz", "gpu_utilization_percent"]
SWEPT_NODE = [
    ("disk_temperature_celsius", "nvme0n1"),
    ("pcie_aer_correctable_errors_total", "0000:17:00.0"),
    ("pcie_aer_correctable_errors_total", "0000:2a:00.0"),
    ("ib_symbol_errors_total", "mlx5_0/1"),
    ("ib_port_xmit_wait_total", "mlx5_0/1"),
    ("rdma_qps_dropped_per_second", "mlx5_0/1"),
]


class TimedStore(Store):
    """The real store, timing the query (SQL, transfer to arrow) apart from the numpy work."""

    query_s: list[float] = []
    rows: list[int] = []

    def query_arrow(self, sql, parameters=None, settings=None):
        start = time.perf_counter()
        table = super().query_arrow(sql, parameters, settings)
        self.query_s.append(time.perf_counter() - start)
        self.rows.append(table.num_rows)
        return table


def _array(values: list[str]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _insert(db: str, select: str) -> str:
    return f"INSERT INTO {db}.metrics (node_id, metric_name, device, labels, value, timestamp) {select}"


def fill(store: Store, nodes: int, end_ms: int, gpu_parts: bool, swept: int) -> int:
    """Stream rows of the first nodes - swept nodes, sweep rows of all, a class fingerprint each."""
    db = store.database
    metric_set = load_sets()["gpu_node"]
    node_slots, job_slots = metric_set.parts["node"], metric_set.parts["job"]
    steps = MINUTES * 60_000 // STEP_MS

    def source(every: int, streaming: bool) -> str:
        count = nodes * (steps // every)
        keep = f"WHERE number % {nodes} < {nodes - swept}" if streaming else ""
        return (
            f"(SELECT concat('node', leftPad(toString(number % {nodes}), 5, '0')) AS node, "
            f"intDiv(number, {nodes}) AS step, number % {nodes} AS n, fromUnixTimestamp64Milli("
            f"toInt64({end_ms - steps * STEP_MS} + step * {every * STEP_MS} + (n * 37) % 4500), 'UTC') AS ts "
            f"FROM numbers({count}) {keep})"
        )

    stream, sweep = source(1, True), source(12, False)
    noise = "(cityHash64(node, m, step) % 1000) / 10"
    statements = [
        _insert(
            db,
            f"SELECT node, m, 'node', map('source', 'stream', 'agg', a), 50 + {noise}, ts FROM {stream} "
            f"ARRAY JOIN {_array([s.metric for s in node_slots])} AS m, "
            f"{_array([str(s.agg) for s in node_slots])} AS a",
        ),
        _insert(
            db,
            f"SELECT node, m, 'job', map('source', 'stream', 'job', toString(7000 + intDiv(n, 16)), "
            f"'rank', '0'), 100 + {noise}, ts FROM {stream} "
            f"ARRAY JOIN {_array([s.metric for s in job_slots])} AS m",
        ),
        _insert(  # the sweep, every 60 s: per GPU, the drive, the counters
            db,
            f"SELECT node, m, concat('gpu', toString(g)), map(), {noise}, ts FROM {sweep} "
            f"ARRAY JOIN {_array(SWEPT_GPU)} AS m ARRAY JOIN range(8) AS g",
        ),
        _insert(
            db,
            f"SELECT node, m, d, map(), step * 10 + n, ts FROM {sweep} "
            f"ARRAY JOIN {_array([m for m, _d in SWEPT_NODE])} AS m, "
            f"{_array([d for _m, d in SWEPT_NODE])} AS d",
        ),
        f"INSERT INTO {db}.fingerprints (fingerprint, kind, node_id, detail, first_seen) "
        f"SELECT 'h200x8', 'class', concat('node', leftPad(toString(number), 5, '0')), "
        f"'{json.dumps({'gpu': {'models': ['NVIDIA H200'], 'count': 8}})}', now64(3) FROM numbers({nodes})",
    ]
    if gpu_parts:
        statements.append(
            _insert(
                db,
                f"SELECT node, m, concat('gpu', toString(g)), map('source', 'stream'), {noise}, ts "
                f"FROM {stream} ARRAY JOIN {_array([s.metric for s in metric_set.parts['gpu']])} AS m "
                f"ARRAY JOIN range(8) AS g",
            )
        )
    for statement in statements:
        store.command(statement)
    return int(store.query(f"SELECT count() FROM {db}.metrics")[0][0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-gpu-parts", action="store_true")
    parser.add_argument("--swept-share", type=float, default=0.05, help="nodes that only the sweep reports")
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks" / "results" / "features_read.json")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="features-read-"))
    end_ms = (now_ms() // STEP_MS) * STEP_MS
    with TimedStore(f"chdb://{work / 'db'}", "bench") as store:
        store.init_schema()
        began = time.perf_counter()
        swept = int(args.nodes * args.swept_share)
        stored = fill(store, args.nodes, end_ms, not args.no_gpu_parts, swept)
        fill_s = time.perf_counter() - began
        totals = []
        for _ in range(args.repeat):
            began = time.perf_counter()
            windows = features.read_windows(store, end_ms)
            totals.append(time.perf_counter() - began)
    shutil.rmtree(work, ignore_errors=True)
    streaming = args.nodes - swept
    observed = float(windows.mask[:streaming].mean())
    observed_swept = float(windows.mask[streaming:].mean()) if swept else None
    result = {
        "nodes": len(windows.node_ids),
        "rows_in_store": stored,
        "rows_read": store.rows[-1],
        "gpu_parts": not args.no_gpu_parts,
        "fill_s": round(fill_s, 1),
        "read_windows_s": {"median": round(statistics.median(totals), 3), "min": round(min(totals), 3)},
        "query_s": {
            "median": round(statistics.median(store.query_s), 3),
            "min": round(min(store.query_s), 3),
        },
        "numpy_s_median": round(statistics.median(totals) - statistics.median(store.query_s), 3),
        "swept_nodes": swept,
        "observed_share_streaming": round(observed, 3),
        "observed_share_swept": round(observed_swept, 3) if observed_swept is not None else None,
        "hw_classes": sorted(set(windows.hw_class)),
        "target_s": 1.2,
        "load_average_after": [round(v, 2) for v in os.getloadavg()],  # the machine is shared
    }
    print(json.dumps(result, indent=2))
    write_results(args.out, result, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
