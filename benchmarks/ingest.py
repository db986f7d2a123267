#!/usr/bin/env python3
"""Ingest throughput: the store's columnar write against a bare clickhouse-connect insert, same rows,
same run, embedded ClickHouse (chdb). Target: >= 500,000 rows/s and >= 80 % of bare.

    .venv/bin/python benchmarks/ingest.py [--rows 2000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import clickhouse_connect
from provenance import write_results

from stethoscope import stats
from stethoscope.store.batch import METRIC_COLUMNS, Batch, MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.schema import single_node_ddl
from stethoscope.store.writer import Writer
from stethoscope.timeutil import now_ms

METRICS = [
    "gpu_temperature_celsius",
    "gpu_power_watts",
    "gpu_sm_clock_mhz",
    "gpu_memory_clock_mhz",
    "gpu_utilization_percent",
    "gpu_memory_used_mib",
    "gpu_pcie_rx_mb_per_s",
    "gpu_pcie_tx_mb_per_s",
    "gpu_ecc_corrected_volatile_total",
    "gpu_throttle_reasons_active",
    "nvlink_crc_errors_total",
    "ib_symbol_errors_total",
    "ib_port_xmit_wait_total",
    "rdma_out_of_buffer_total",
    "pcie_aer_correctable_errors_total",
    "nvme_percentage_used",
    "disk_temperature_celsius",
    "net_mtu",
    "cpu_max_cstate",
    "numa_balancing_enabled",
]


def make_rows(count: int) -> MetricColumns:
    """2,000 nodes x 20 metrics x 8 GPUs-ish devices, 5-second steps: the seed's fleet shape."""
    batch = MetricColumns()
    start = now_ms() - 3_600_000
    per_step = 2000 * len(METRICS)
    for i in range(count):
        step, within = divmod(i, per_step)
        node, metric = divmod(within, len(METRICS))
        batch.append(
            f"node{node:04d}", METRICS[metric], f"gpu{node % 8}", {}, float(i % 977), start + step * 5000
        )
    return batch


def bare_insert(path: Path, rows: MetricColumns) -> float:
    client = clickhouse_connect.get_client(dsn=f"chdb://{path}", database="default")
    for statement in single_node_ddl("bare"):
        client.command(statement)
    started = time.perf_counter()
    client.insert("bare.metrics", rows.columns(), column_names=list(METRIC_COLUMNS), column_oriented=True)
    elapsed = time.perf_counter() - started
    client.close()
    return elapsed


def store_insert(path: Path, rows: MetricColumns) -> float:
    with Store(f"chdb://{path}", "stored") as store:
        store.init_schema()
        started = time.perf_counter()
        store.insert_metrics(rows)
        return time.perf_counter() - started


def writer_write(path: Path, rows: MetricColumns) -> float:
    """The callback's whole path: open, ensure schema, replay the (empty) spool, write, close."""
    writer = Writer(f"chdb://{path}", path.parent / "spool", timeout=120)
    started = time.perf_counter()
    report = writer.write(Batch(metrics=rows))
    assert report.error is None, report.error
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "ingest.json")
    args = parser.parse_args()
    rows = make_rows(args.rows)
    results: dict[str, list[float]] = {"bare": [], "store": [], "writer": []}
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(args.repeat):  # interleaved, so drift hits all three alike
            for name, run in (("bare", bare_insert), ("store", store_insert), ("writer", writer_write)):
                target = Path(tmp) / f"{name}-{attempt}" / "db"
                target.parent.mkdir()
                results[name].append(args.rows / run(target, rows))
    medians = {name: stats.median(values) for name, values in results.items()}
    report = {
        "rows": args.rows,
        "repeat": args.repeat,
        "rows_per_second_median": {k: round(v) for k, v in medians.items()},
        "rows_per_second_all": {k: [round(v) for v in vs] for k, vs in results.items()},
        "store_vs_bare": round(medians["store"] / medians["bare"], 3),
        "writer_vs_bare": round(medians["writer"] / medians["bare"], 3),
        "target": ">= 500000 rows/s and >= 0.80 of bare",
    }
    print(json.dumps(report, indent=1))
    write_results(args.out, report)


if __name__ == "__main__":
    main()
