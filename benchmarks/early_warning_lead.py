#!/usr/bin/env python3
"""Lead of the early warning on the lab: a disk whose reallocated sectors climb steadily toward the
hard limit (the lab's `climbing_ssd`, node07's Intel S4500 capture, 2 sectors a sweep) is swept at the
lab's spacing (60 s) into embedded ClickHouse, the `ssd_reallocated` family is evaluated after each
sweep, and the minutes between its first early-warning finding and its first hard-limit finding are
printed (and written to benchmarks/results/early_warning_lead.json).

    .venv/bin/python benchmarks/early_warning_lead.py [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import project_root
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

TOP = project_root()
sys.path.insert(0, str(TOP / "tools"))
from lab_replay import SWEEP_MS, first_findings, lab  # noqa: E402
from provenance import write_results  # noqa: E402

NODE, DISKS = "node07", ["sda", "sdb"]
FAMILY, WARNING, LIMIT = "ssd_reallocated", "ssd_reallocated_climbing", "ssd_reallocated_sectors"


def measure(steps: int) -> dict:
    rules = [r for r in load_rules(TOP / "rules", Catalog.load()).rules if r.family == FAMILY]
    with tempfile.TemporaryDirectory() as tmp:
        lab_dir = Path(tmp) / "lab"
        lab(lab_dir, "build", "--nodes", "7", "--only-faults", "climbing_ssd")
        with Store(f"chdb://{Path(tmp) / 'db'}") as store:
            store.init_schema()
            start = now_ms() - steps * SWEEP_MS
            first = first_findings(store, lab_dir, NODE, DISKS, rules, steps, start)
    result = {"sweep_s": SWEEP_MS // 1000, "steps": steps, "first_step": first}
    if WARNING in first and LIMIT in first:
        result["lead_minutes"] = (first[LIMIT] - first[WARNING]) * SWEEP_MS / 60_000
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/early_warning_lead.json")
    args = parser.parse_args()
    result = measure(args.steps)
    print(json.dumps(result, indent=1))
    if "lead_minutes" not in result:
        print("early_warning_lead: the warning or the hard limit never fired", file=sys.stderr)
        return 3
    lead, sweep = result["lead_minutes"], result["sweep_s"]
    print(f"early warning {lead:.0f} min before the hard limit (sweeps of {sweep} s)")
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
