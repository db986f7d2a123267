#!/usr/bin/env python3
"""A fault present in every sweep, with sweeps every 300 s ±60 s and a lost sweep, is found at every
5-minute instant for 4 hours, and the healthy nodes give no finding.

The lab is swept three times for real (collect.yml, the callback, embedded ClickHouse); its rows are
laid out again every 300 s ± 60 s over 4 h 30 min with one sweep lost, the inventory declaring
`stethoscope_sweep_interval: 300`. At every 5-minute instant of the last 4 hours the diagnosis cycle
runs as `serve` runs it without --execute (remediation.cycle.Cycles, long-running: its open findings
held by the hysteresis), and as `diagnose --execute` runs it (the findings table, a log action per
transaction). Reported: per state fault of the lab, the instants it was found; the healthy nodes'
findings; transactions and actions per fault; the cycle's seconds.

    .venv/bin/python benchmarks/cadence_hysteresis.py [--hours 4] [--interval 300] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP / "benchmarks"))
sys.path.insert(0, str(TOP / "tools"))

from lab_sweeps import HEALTHY, STATE_FAULTS, jittered, lay_out, record  # noqa: E402
from provenance import stamp, write_results  # noqa: E402

from stethoscope.catalog import Catalog  # noqa: E402
from stethoscope.diagnosis.rules import load_rules  # noqa: E402
from stethoscope.inventory import load_inventory  # noqa: E402
from stethoscope.remediation.cycle import Cycles  # noqa: E402
from stethoscope.remediation.executor import Context  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.timeutil import now_ms  # noqa: E402

MINUTE = 60_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--interval", type=int, default=300)
    parser.add_argument("--jitter", type=int, default=60)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/cadence_hysteresis.json")
    args = parser.parse_args()
    provenance = stamp()
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        recorded = record(tmp)
        end = now_ms() - MINUTE
        count = int((args.hours + 0.5) * 3600 / args.interval) + 1
        # one sweep never came, half way through
        times = jittered(
            end, args.interval, count, seed=2026, lost=(count // 2,), jitter=args.jitter / args.interval
        )
        dsn = f"chdb://{tmp / 'db'}"
        database = f"b_{uuid.uuid4().hex[:8]}"
        with Store(dsn, database) as store:
            store.init_schema()
            lay_out(store, recorded, times)
        catalog = Catalog.load().with_intervals(args.interval)
        rules = load_rules(TOP / "rules", catalog).rules
        inventory_file = tmp / "hosts.yml"
        inventory_file.write_text(
            "---\nall:\n  vars:\n    ansible_connection: local\n  hosts:\n"
            + "".join(f"    node{i:02d}: {{}}\n" for i in range(1, 9))
        )
        inventory = load_inventory(inventory_file)
        log = tmp / "findings.log"
        context = Context(
            dsn, database, inventory, {"stethoscope_diagnose_log": str(log)}, spool_dir=tmp / "spool2"
        )
        dry = Cycles(dsn, database, catalog, long_running=True, nodes=sorted(inventory.hosts))
        instants = list(range(end - int(args.hours * 3600_000), end + 1, 5 * MINUTE))
        found_dry = {fault: 0 for fault in STATE_FAULTS}
        healthy_dry: list[tuple] = []
        seconds = []
        for at in instants:
            started = time.monotonic()
            result = dry.run(rules, at)
            seconds.append(time.monotonic() - started)
            found = {(f["node_id"], f["rule_id"]) for f in result.findings}
            for fault in STATE_FAULTS:
                found_dry[fault] += fault in found
            healthy_dry += [f for f in found if f[0] in HEALTHY]
        executing = Cycles(
            dsn,
            database,
            catalog,
            execute_with=lambda d, db: context,
            nodes=sorted(inventory.hosts),
            long_running=True,
        )
        found_exec = {fault: 0 for fault in STATE_FAULTS}
        txns: dict[tuple, set] = {fault: set() for fault in STATE_FAULTS}
        # the rules as shipped, a log line their only action: the executing cycle's ledger at work
        log_only = [replace(rule, level="L1", actions=()) for rule in rules]
        for at in instants:
            for f in executing.run(log_only, at).findings:
                fault = (f["node_id"], f["rule_id"])
                if fault in found_exec:
                    found_exec[fault] += 1
                    txns[fault].add(f.get("txn_id"))
        executing.close()
        logged: dict[tuple, int] = {}
        for line in log.read_text().splitlines() if log.exists() else []:
            entry = json.loads(line)
            key = (entry["node_id"], entry["rule_id"])
            logged[key] = logged.get(key, 0) + 1
    result = {
        "target": "a fault in every sweep (300 s ±60 s, one lost) found at every 5-minute instant for 4 h; "
        "healthy nodes: no finding",
        "hours": args.hours,
        "sweep_interval_s": args.interval,
        "jitter_s": args.jitter,
        "sweeps_laid_out": len(times),
        "sweeps_lost": 1,
        "instants": len(instants),
        "dry_run_long_running": {f"{n} {r}": c for (n, r), c in found_dry.items()},
        "executing": {f"{n} {r}": c for (n, r), c in found_exec.items()},
        "transactions_per_fault": {f"{n} {r}": len(t) for (n, r), t in txns.items()},
        "log_actions_per_fault": {f"{n} {r}": logged.get((n, r), 0) for (n, r) in STATE_FAULTS},
        "healthy_node_findings": sorted(set(healthy_dry)),
        "cycle_seconds": {
            "median": round(statistics.median(seconds), 3),
            "max": round(max(seconds), 3),
        },
        "met": all(c == len(instants) for c in found_dry.values())
        and all(c == len(instants) for c in found_exec.values())
        and not healthy_dry,
    }
    print(json.dumps(result, indent=1))
    write_results(args.out, result, provenance)


if __name__ == "__main__":
    main()
