#!/usr/bin/env python3
"""Time and figures of `stethoscope audit` on the lab's fault history.

1. The lab as `make demo` sweeps it: three real `collect.yml` runs, then `audit --faults
   inventories/lab/faults.yml` (impact = the last sweep): per kind the median lead and the audit's
   time. The lab injects every fault from its first sweep, so leads are bounded by its sweeps' span.
2. A slow fault in lab time: node07's climbing SSD (tools/lab.py `climbing_ssd`, 2 reallocated sectors
   a sweep) replayed one sweep a minute with the collector's own parser (tools/lab_replay.py); its
   impact is the first sweep at which the hard limit (`ssd_reallocated_sectors`) fires, and the audit
   says how far ahead of it the diagnosis warned.

    .venv/bin/python benchmarks/audit_lab.py [--steps 60] [--skip-sweeps]

Writes benchmarks/results/audit_lab.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))
sys.path.insert(0, str(TOP / "tools"))

from lab_replay import SWEEP_MS, first_findings, lab  # noqa: E402
from provenance import write_results  # noqa: E402

from stethoscope.catalog import Catalog  # noqa: E402
from stethoscope.diagnosis.audit import run_audit  # noqa: E402
from stethoscope.diagnosis.rules import load_rules  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.store.faults import Fault, record  # noqa: E402
from stethoscope.timeutil import now_ms  # noqa: E402

BIN = Path(sys.executable).parent


def _env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(TOP / "ansible.cfg"),
        ANSIBLE_INVENTORY=str(TOP / "inventories/lab/hosts.yml"),  # ansible.cfg names none
        ANSIBLE_COLLECTIONS_PATH=str(TOP / ".collections"),
        ANSIBLE_LOCAL_TEMP=str(tmp / "ansible-tmp"),
        ANSIBLE_HOME=str(tmp / "ansible-home"),
        STETHOSCOPE_SPOOL_DIR=str(tmp / "spool"),
        STETHOSCOPE_DSN=f"chdb://{tmp / 'db'}",
        STETHOSCOPE_LAB_DIR=str(tmp / "lab"),
        PYTHONPATH=str(TOP),
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


def lab_sweeps() -> dict:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        env = _env(tmp)
        cli = [sys.executable, "-m", "stethoscope.cli"]
        subprocess.run([sys.executable, str(TOP / "tools/lab.py"), "build"], env=env, check=True)
        subprocess.run([*cli, "db", "init"], env=env, cwd=TOP, check=True, capture_output=True)
        for _ in range(3):
            subprocess.run(
                [str(BIN / "ansible-playbook"), str(TOP / "playbooks/collect.yml")],
                env=env, cwd=TOP, check=True, capture_output=True,
            )  # fmt: skip
        started = time.perf_counter()
        audit = [*cli, "audit", "--faults", str(TOP / "inventories/lab/faults.yml"), "--json"]
        done = subprocess.run(audit, env=env, cwd=TOP, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
    result = json.loads(done.stdout)
    return {
        "exit_code": done.returncode,
        "command_seconds": round(seconds, 2),
        "audit_seconds": result["seconds"],
        "faults": len(result["faults"]),
        "warned": sum(f["outcome"] == "warned" for f in result["faults"]),
        "median_lead_minutes": {k["kind"]: k["median_lead_minutes"] for k in result["kinds"]},
    }


def climbing_ssd(steps: int) -> dict:
    catalog = Catalog.load()
    rules = load_rules(TOP / "rules", catalog).rules
    family = [r for r in rules if r.family == "ssd_reallocated"]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        lab(tmp / "lab", "build", "--nodes", "7", "--only-faults", "climbing_ssd")
        with Store(f"chdb://{tmp / 'db'}") as store:
            store.init_schema()
            start = now_ms() - steps * SWEEP_MS
            first = first_findings(store, tmp / "lab", "node07", ["sda", "sdb"], family, steps, start)
            if "ssd_reallocated_sectors" not in first:
                return {"error": f"the hard limit never fired in {steps} sweeps", "first_step": first}
            impact = start + first["ssd_reallocated_sectors"] * SWEEP_MS
            fault = Fault("node07", "ssd_wear", "storage", impact, "sda", "added", "climbing_ssd")
            copied = record(store, fault)
            audit = run_audit(store, [fault], rules, catalog, 30.0)
    (outcome,) = audit.faults
    return {
        "sweep_s": SWEEP_MS // 1000,
        "steps": steps,
        "first_step": first,
        "rows_kept_in_fault_windows": copied,
        "instants_scanned": outcome.instants,
        "lead_minutes": outcome.lead_minutes,
        "first_warning_rule": outcome.rule_id,
        "audit_seconds": round(audit.seconds, 2),
    }


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip-sweeps", action="store_true", help="only the climbing SSD part")
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/audit_lab.json")
    args = parser.parse_args()
    result = {"climbing_ssd": climbing_ssd(args.steps)}
    if not args.skip_sweeps:
        result["lab_sweeps"] = lab_sweeps()
    print(json.dumps(result, indent=1))
    write_results(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
