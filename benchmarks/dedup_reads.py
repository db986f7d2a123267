#!/usr/bin/env python3
"""How the rules read each (series, timestamp) once: `GROUP BY ... timestamp` against `FINAL`.

One full rules cycle each, interleaved, over N nodes x 24 h of 5-second data (diagnosis_cycle.py's
data) with the last hour stored twice (a replayed spool), first as inserted (parts awaiting their
merge), then after OPTIMIZE ... FINAL.

    .venv/bin/python benchmarks/dedup_reads.py [--nodes 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from diagnosis_cycle import generate
from provenance import write_results

from stethoscope.catalog import Catalog
from stethoscope.diagnosis import engine
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import project_root
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

STRATEGIES = ("group_by", "final")


def cycle(store: Store, rules: list, end_ms: int, strategy: str) -> float:
    engine.QueryBuilder.dedup = strategy
    started = time.perf_counter()
    for rule in rules:
        engine.evaluate(store, rule, end_ms)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "dedup_reads.json")
    args = parser.parse_args()
    rules = load_rules(project_root() / "rules", Catalog.load()).rules
    end_ms = now_ms() - 1000
    phases = []
    with (
        tempfile.TemporaryDirectory(prefix="stethoscope-bench-") as folder,
        Store(f"chdb://{folder}/db") as store,
    ):
        store.init_schema()
        rows = generate(store, args.nodes, end_ms)
        db = store.database
        store.command(
            f"INSERT INTO {db}.metrics (node_id, metric_name, device, labels, value, timestamp) "
            f"SELECT node_id, metric_name, device, labels, value, timestamp FROM {db}.metrics "
            f"WHERE timestamp > fromUnixTimestamp64Milli({end_ms - 3_600_000}, 'UTC')"
        )
        for phase in ("as inserted", "after OPTIMIZE FINAL"):
            if phase != "as inserted":
                store.command(f"OPTIMIZE TABLE {db}.metrics FINAL")
            parts = store.query(
                f"SELECT count() FROM system.parts WHERE database = '{db}' AND table = 'metrics' AND active"
            )[0][0]
            seconds: dict[str, list[float]] = {name: [] for name in STRATEGIES}
            for _ in range(args.repeat):
                for name in STRATEGIES:
                    seconds[name].append(round(cycle(store, rules, end_ms, name), 3))
            result = {
                "phase": phase,
                "active_parts": parts,
                "cycle_seconds": seconds,
                "median_seconds": {name: statistics.median(values) for name, values in seconds.items()},
            }
            phases.append(result)
            print(json.dumps(result), flush=True)
    engine.QueryBuilder.dedup = "group_by"
    report = {"nodes": args.nodes, "rows_generated": rows, "rules": len(rules), "phases": phases}
    write_results(args.out, report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
