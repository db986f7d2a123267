#!/usr/bin/env python3
"""The board at fleet scale: `stethoscope report --out DIR --days 7` for 2,000 nodes, rules evaluated
at each day's end as the command does. Data generated inside ClickHouse: per node an hourly sample of
one metric per layer for 7 days (the job layer only on a third of the nodes), 92 days of SMART
reallocated sectors (growing on some drives), stored findings on 5 % of the nodes. Targets:
renders in <= 10 s, the page under 5 MB.

    .venv/bin/python benchmarks/board_scale.py [--nodes 2000] [--days 7]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from provenance import write_results

from stethoscope.catalog import Catalog
from stethoscope.report.board import collect, render_terminal, write
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

TOP = Path(__file__).resolve().parent.parent
HOUR = 3600

LAYER_METRICS = """INSERT INTO {db}.metrics (node_id, metric_name, device, labels, value, timestamp)
SELECT concat('node', leftPad(toString(n), 4, '0')), m.1, m.2, map(), m.3,
  toDateTime64({start} + h * 3600 + 17, 3, 'UTC')
FROM (SELECT number % {nodes} AS n, intDiv(number, {nodes}) AS h FROM numbers({nodes} * {hours}))
ARRAY JOIN [('gpu_temperature_celsius', 'gpu0', if(n % 97 = 0, 93.0, 61.0)),
            ('nvlink_error_rate_percent', 'gpu0/link0', 0.0),
            ('ib_port_state', 'mlx5_0/1', 4.0),
            ('train_step_time_ms', 'job', if(n % 3 = 0, 410.0, nan))] AS m
WHERE NOT isNaN(m.3)"""

SMART = """INSERT INTO {db}.metrics (node_id, metric_name, device, labels, value, timestamp)
SELECT concat('node', leftPad(toString(n), 4, '0')), 'smart_reallocated_sector_ct', 'sda', map(),
  if(n % 50 = 0, toFloat64(d * 3), 4.0), toDateTime64({start} + d * 86400 + 60, 3, 'UTC')
FROM (SELECT number % {nodes} AS n, intDiv(number, {nodes}) AS d FROM numbers({nodes} * 92))"""


def findings(nodes: int, now: int) -> list[dict]:
    rows = []
    for n in range(0, nodes, 20):
        severity = "critical" if n % 40 == 0 else "warning"
        rows.append(
            {
                "finding_id": f"f{n}", "txn_id": f"t{n}", "rule_id": "nvlink_crc_errors",
                "node_id": f"node{n:04d}", "device": "gpu0/link0", "severity": severity,
                "confidence": 1.0, "level": "L2", "message": "NVLink CRC errors growing",
                "evidence": '{"metrics": ["nvlink_crc_errors_total"]}',
                "first_seen": now - (n % 5 + 1) * 86_400_000, "last_seen": now - 3_600_000,
                "status": "open", "version": 1,
            }
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/board_scale.json")
    args = parser.parse_args()
    now = now_ms()
    start = now // 1000 - args.days * 86_400
    with tempfile.TemporaryDirectory() as tmp, Store(f"chdb://{tmp}/db", "bench") as store:
        store.init_schema()
        hours = args.days * 24
        store.command(LAYER_METRICS.format(db=store.database, start=start, nodes=args.nodes, hours=hours))
        store.command(SMART.format(db=store.database, start=now // 1000 - 92 * 86_400, nodes=args.nodes))
        store.insert_rows("findings", findings(args.nodes, now))
        rows = store.query(f"SELECT count() FROM {store.database}.metrics")[0][0]
        started = time.perf_counter()
        board = collect(store, Catalog.load(), args.days, now)
        collected = time.perf_counter()
        page = write(board, Path(tmp) / "out")
        written = time.perf_counter()
        again = time.perf_counter()
        collect(store, Catalog.load(), args.days, now, evaluate=False)
        without_rules_s = time.perf_counter() - again
        terminal = render_terminal(board)
        pages = list((Path(tmp) / "out" / "nodes").glob("*.html"))
        result = {
            "benchmark": "board_scale",
            "nodes": args.nodes,
            "days": args.days,
            "metric_rows": rows,
            "render_s": round(written - started, 2),
            "collect_s": round(collected - started, 2),
            "write_s": round(written - collected, 2),
            "collect_without_rules_s": round(without_rules_s, 2),  # the rest of collect_s: diagnose now
            "target_s": 10,
            "page_bytes": page.stat().st_size,
            "page_target_bytes": 5_000_000,
            "node_pages": len(pages),
            "node_pages_bytes": sum(p.stat().st_size for p in pages),
            "nodes_on_board": len(board.nodes),
            "figures_inline": sum(1 for n in board.nodes if n.figure),
            "worst_first": [n.node_id for n in board.nodes[:5]],
            "terminal_lines": len(terminal.splitlines()),
        }
    write_results(args.out, result, indent=2)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
