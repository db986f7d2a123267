"""Records baseline.yml's Slurm preflight in the `actions` table: one row per node per step
(`baseline:drain`, `baseline:skip`, `baseline:resume`) under the baseline's transaction, so that an
audit sees which nodes were drained for a benchmark and why others were not. These are planned work,
not isolations: the breaker counts only remediation drains.

    python -m stethoscope.bench.preflight record --txn TXN --step drain --decisions JSON
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stethoscope.store.client import Store, StoreError
from stethoscope.timeutil import now_ms


def action_rows(txn_id: str, step: str, decisions: dict[str, Any], at_ms: int) -> list[dict[str, Any]]:
    """decisions: {node: baseline_preflight result (run, drained, reason, node)} -> actions rows."""
    rows = []
    for node, decision in sorted(decisions.items()):
        if not isinstance(decision, dict) or (decision.get("skipped") and "run" not in decision):
            continue
        if step == "resume":
            action, status = "baseline:resume", "ok"
        elif decision.get("drained"):
            action, status = "baseline:drain", "ok"
        else:
            action, status = "baseline:skip" if not decision.get("run") else "baseline:run", "ok"
        detail = {"reason": decision.get("reason", ""), "run": bool(decision.get("run"))}
        if isinstance(decision.get("node"), dict):
            detail["slurm_state"] = "+".join(
                [decision["node"].get("state", ""), *decision["node"].get("flags", [])]
            )
        rows.append(
            {
                "txn_id": txn_id,
                "finding_id": "",
                "action": action,
                "target": node,
                "status": status,
                "detail": json.dumps(detail, sort_keys=True),
                "started_at": at_ms,
                "finished_at": at_ms,
                "version": at_ms,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stethoscope.bench.preflight", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="store the batch's preflight decisions")
    record.add_argument("--txn", required=True)
    record.add_argument("--step", choices=["drain", "resume"], required=True)
    record.add_argument("--decisions", required=True, help="JSON {node: preflight result}")
    record.add_argument("--dsn")
    args = parser.parse_args(argv)
    try:
        decisions = json.loads(args.decisions)
    except ValueError as exc:
        print(f"preflight: --decisions is not JSON: {exc}", file=sys.stderr)
        return 2
    rows = action_rows(args.txn, args.step, decisions, now_ms())
    try:
        with Store(args.dsn) as store:
            store.init_schema()
            store.insert_rows("actions", rows)
    except StoreError as exc:
        print(f"preflight: {exc}", file=sys.stderr)
        return 3
    print(f"preflight: {len(rows)} action(s) recorded under {args.txn}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
