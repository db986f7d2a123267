#!/usr/bin/env python3
"""What `stethoscope summary` pays for its per-node counts (samples, series, last sample): read from
the hourly rollup (report/summary.py, as it reads them now) against the FINAL merge of every raw row
it read before, on N nodes x 20 series x H hours of 5-second samples generated inside ClickHouse.
Wall and CPU seconds per read, medians of `--repeat`; both reads must give the same counts here (no
replayed sample in the data).

    .venv/bin/python benchmarks/summary_scale.py [--nodes 64] [--hours 6] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402
from timing import timed  # noqa: E402

from stethoscope.report.summary import summarize  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402

SERIES = 20
STEP_S = 5
RAW = (
    "SELECT node_id, count(), uniqExact(metric_name, device, labels_key), toString(max(timestamp)) "
    "FROM {db}.metrics FINAL GROUP BY node_id ORDER BY node_id"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/summary_scale.json")
    args = parser.parse_args()
    per_node = SERIES * args.hours * 3600 // STEP_S
    rows = args.nodes * per_node
    with tempfile.TemporaryDirectory() as folder, Store(f"chdb://{folder}") as store:
        store.init_schema()
        db = store.database
        started = time.perf_counter()
        store.command(
            f"INSERT INTO {db}.metrics (node_id, metric_name, device, labels, value, timestamp) "
            f"SELECT concat('node', toString(n % {args.nodes})), "
            f"concat('metric_', toString(intDiv(n, {args.nodes}) % {SERIES})), "
            "'gpu0', map(), 1.0, fromUnixTimestamp64Milli(toInt64(toUnixTimestamp(now()) * 1000 "
            f"- intDiv(n, {args.nodes * SERIES}) * {STEP_S * 1000}), 'UTC') "
            f"FROM (SELECT number AS n FROM numbers({rows}))"
        )
        generated = round(time.perf_counter() - started, 1)
        raw = timed(args.repeat, lambda: store.query(RAW.format(db=db)))
        hourly = timed(args.repeat, lambda: summarize(store, []))
        raw_rows = store.query(RAW.format(db=db))
        nodes = summarize(store, [])
        same = [(n.node_id, n.rows, n.series, n.last_seen) for n in nodes] == [tuple(r) for r in raw_rows]
    write_results(
        args.out,
        {
            "nodes": args.nodes,
            "hours": args.hours,
            "rows": rows,
            "generate_seconds": generated,
            "raw_final": raw,
            "hourly_rollup_as_summary_reads": hourly,
            "same_counts": same,
        },
    )
    print(f"{rows} rows: raw FINAL {raw}, summary from the hourly rollup {hourly}, same counts: {same}")


if __name__ == "__main__":
    main()
