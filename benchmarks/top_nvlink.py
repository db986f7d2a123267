#!/usr/bin/env python3
"""The seed's headline query: "top 10 nodes by NVLink error rate over the last 7 days", from
metrics_hourly (whole hours) plus raw rows at the partial ends, and from the raw rows alone, in the
same run, on data generated inside ClickHouse (INSERT ... SELECT FROM numbers(), hour by hour, the
materialized view filling the rollup as it would from the collector). Target: <= 300 ms
from the rollup on 200 nodes x 8 GPUs x 7 days of 5-second rates (about 190 M rows).

    .venv/bin/python benchmarks/top_nvlink.py [--nodes 200] [--gpus 8] [--days 7] [--interval 5]

The rollup holds one row per series and hour whatever the interval, so `--interval 30` (32 M raw
rows, results/top_nvlink.json) reads the same rollup as the 5-second set (results/top_nvlink_5s.json)
and differs only in the raw rows of the partial hours and in the raw-rows time beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from provenance import write_results

from stethoscope.catalog import Catalog
from stethoscope.report.top import HOUR_MS, Window, top
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

TOP = Path(__file__).resolve().parent.parent
METRIC = "nvlink_error_rate_percent"

# one row per (5-second step, node, GPU) of the hour starting at {h} (epoch seconds); a few nodes
# (every 37th) err far more often, the rest now and then
GENERATE = """INSERT INTO {db}.metrics (node_id, metric_name, device, labels, value, timestamp)
SELECT concat('node', leftPad(toString(intDiv(s, {gpus})), 4, '0')), '{metric}',
  concat('gpu', toString(s % {gpus}), '/link0'), map('source', 'stream'),
  if(cityHash64(number, {h}) % if(intDiv(s, {gpus}) % 37 = 0, 50, 5000) = 0,
     (cityHash64(number, {h}, 1) % 10000) / 1000.0, 0.0),
  toDateTime64({h} + intDiv(number, {series}) * {interval}, 3, 'UTC')
FROM (SELECT number, number % {series} AS s FROM numbers({rows}))"""


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--days", type=float, default=7)
    parser.add_argument("--interval", type=int, default=5, help="seconds between samples")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/top_nvlink.json")
    args = parser.parse_args()
    series = args.nodes * args.gpus
    end_ms = now_ms() // HOUR_MS * HOUR_MS - HOUR_MS + 1_234_000  # mid-hour: partial hours at both ends
    window = Window(end_ms - round(args.days * 86_400_000), end_ms)
    hours = range(window.start_ms // HOUR_MS, -(-window.end_ms // HOUR_MS))
    with tempfile.TemporaryDirectory() as tmp, Store(f"chdb://{tmp}/db", "bench") as store:
        store.init_schema()
        started = time.perf_counter()
        for hour in hours:
            store.command(
                GENERATE.format(
                    db=store.database, metric=METRIC, gpus=args.gpus, series=series, h=hour * 3600,
                    interval=args.interval, rows=series * 3600 // args.interval,
                )
            )  # fmt: skip
        generate_s = time.perf_counter() - started
        rows = store.query(f"SELECT count() FROM {store.database}.metrics")[0][0]
        hourly = store.query(f"SELECT count() FROM {store.database}.metrics_hourly")[0][0]
        store.command(f"OPTIMIZE TABLE {store.database}.metrics_hourly FINAL")  # as background merges do
        catalog = Catalog.load()
        rollup_ms, from_rollup = timed(lambda: top(store, catalog, METRIC, window, 10), args.repeat)
        raw_ms, from_raw = timed(lambda: top(store, catalog, METRIC, window, 10, via="raw"), args.repeat)
    result = {
        "benchmark": "top_nvlink",
        "query": f"stethoscope top {METRIC} --days {args.days:g} --limit 10",
        "nodes": args.nodes,
        "gpus": args.gpus,
        "days": args.days,
        "interval_s": args.interval,
        "raw_rows": rows,
        "hourly_rows": hourly,
        "generate_s": round(generate_s, 1),
        "rollup_ms_median": round(rollup_ms, 1),
        "raw_ms_median": round(raw_ms, 1),
        "repeat": args.repeat,
        "target_ms": 300,
        "equal": from_rollup == from_raw,
        "top": [entry.as_dict() for entry in from_rollup],  # type: ignore[attr-defined]
    }
    write_results(args.out, result, indent=2)
    print(json.dumps({k: v for k, v in result.items() if k != "top"}, indent=2))


if __name__ == "__main__":
    main()
