"""`stethoscope verify`: after a repair, may the node go back into service? (remediation/repair.py)

verify.yml runs it three times: `--check-drain` before any benchmark (is the drain stethoscope's,
under this txn, in the actions table and in Slurm?), then the verdict after the re-benchmark (the
drain ours, no finding of warning or worse matching on the node now, each metric of the incident's
rule sampled on the node since the drain and inside its window, every result green), and
`--resumed` once the node is resumed (its drain ends, its findings resolve). Exit 0: go on; 1: the
node stays drained, and stderr says why and what to do; 2: a usage error."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.cli.common import Subcommands, catalog_for, checked_rules, inventory_of, say
from stethoscope.cli.exit_codes import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from stethoscope.inventory import Inventory
from stethoscope.remediation.repair import Ownership, ownership, stale_metrics, still_matching
from stethoscope.store.client import Store
from stethoscope.timeutil import moment_ms, now_ms


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    verify = commands.add_parser(
        "verify",
        help="after a repair: is the node's drain ours, and is its new benchmark green?",
        parents=parents,
    )
    verify.add_argument("--node", required=True, help="inventory hostname")
    verify.add_argument("--txn", required=True, help="the transaction id of the drain")
    verify.add_argument(
        "--inventory",
        type=Path,
        help="inventory the node must be a host of (or $STETHOSCOPE_INVENTORY; required)",
    )
    verify.add_argument(
        "--since", help="only benchmark results from this time on (ISO-8601, epoch seconds or a duration ago)"
    )
    verify.add_argument(
        "--resumed",
        action="store_true",
        help="record that the node was resumed under this txn (verify.yml does): its findings resolve",
    )
    verify.add_argument(
        "--check-drain",
        action="store_true",
        help="only check the drain is stethoscope's under this txn (verify.yml does, before benchmarking)",
    )
    verify.add_argument(
        "--rules",
        type=Path,
        help="rules evaluated on the node now: a match keeps it drained (default rules/)",
    )
    verify.set_defaults(func=verify_command)


def _slurm_environment(inventory: Inventory) -> dict[str, str]:
    environment = inventory.settings.get("stethoscope_slurm_environment") or {}
    return {str(k): str(v) for k, v in dict(environment).items()} if isinstance(environment, dict) else {}


def verify_command(args: argparse.Namespace) -> int:
    try:
        since_override = moment_ms(args.since, now_ms()) if args.since else None
    except ValueError:
        say(f"verify: --since {args.since!r} is neither ISO-8601, epoch seconds nor a duration ago")
        return EXIT_USAGE
    inventory = inventory_of(args, required=True)
    host = inventory.host(args.node) if inventory is not None else None
    if inventory is None or host is None:
        where = inventory.path if inventory else "the inventory"
        say(f"verify: {args.node!r} is not a valid host of {where}")
        return EXIT_USAGE
    if args.resumed:
        return _record_resume(args)
    rules = None if args.check_drain else checked_rules(args.rules, catalog_for(inventory), "verify").rules
    environment = _slurm_environment(inventory)
    with Store(args.dsn, args.database) as store:
        owner = ownership(store, args.node, host.slurm_name, args.txn, environment)
        if rules is None:  # --check-drain
            return _say_ownership(args, owner)
        from stethoscope.bench import baseline

        at = now_ms()
        matching = still_matching(store, rules, args.node, at)
        drained_at = owner.drained_at_ms or 0
        stale = stale_metrics(store, rules, owner.rule_id, args.node, drained_at, at)
        # the benchmark that counts is one run after the drain (or after --since)
        since_ms = since_override if since_override is not None else (owner.drained_at_ms or 0)
        result = baseline.verify(store, Catalog.load(), args.node, since_ms, at)
    verdict = {
        **_ownership_verdict(args, owner),
        "benchmarked_since": result["benchmarked_since"],
        "stale_suites": result["stale_suites"],
        "green": result["green"],
        "references": sorted({c.reference for c in result["checks"]}),
        "not_green": [
            {
                "suite": c.suite,
                "metric": c.metric_name,
                "labels": c.labels,
                "grade": c.grade,
                "deviation": c.deviation_percent,
                "reference": c.reference,
            }
            for c in result["checks"]
            if c.grade != "green"
        ],
        "still_matching": [_matching(f) for f in matching],
        "no_fresh_data": stale,
        "reasons": owner.reasons
        + [f"still matching: {_line(f)}" for f in matching]
        + [_unswept(metric, args.node) for metric in stale]
        + result["reasons"],
        "resume": owner.owned and not matching and not stale and result["green"],
    }
    print(json.dumps(verdict, sort_keys=True))
    if not verdict["resume"]:
        say(f"verify: {args.node} stays drained: {'; '.join(verdict['reasons']) or 'not green'}")
        if matching:
            say(f"verify: repair {args.node} until these stop matching, then run verify again")
    return EXIT_OK if verdict["resume"] else EXIT_FINDINGS


def _unswept(metric: str, node: str) -> str:
    return (
        f"no fresh data of {metric} since the drain: sweep the node (collect.yml --limit {node}) "
        "and verify again"
    )


def _ownership_verdict(args: argparse.Namespace, owner: Ownership) -> dict[str, Any]:
    return {
        "node": args.node,
        "txn_id": args.txn,
        "rule_id": owner.rule_id,
        "drain_recorded": owner.drained_at_ms is not None,
        "drain_owned": owner.owned,
        "slurm_reason": owner.slurm_reason,
        "todo": owner.todo,
    }


def _say_ownership(args: argparse.Namespace, owner: Ownership) -> int:
    print(json.dumps({**_ownership_verdict(args, owner), "reasons": owner.reasons}, sort_keys=True))
    if owner.owned:
        return EXIT_OK
    say(f"verify: not benchmarking {args.node}: {'; '.join(owner.reasons)}; {owner.todo}")
    return EXIT_FINDINGS


def _matching(finding: dict[str, Any]) -> dict[str, Any]:
    keys = ("rule_id", "device", "severity", "message")
    return {key: finding.get(key, "") for key in keys}


def _line(finding: dict[str, Any]) -> str:
    device = f" {finding['device']}" if finding.get("device") else ""
    return f"{finding['rule_id']} ({finding['severity']}{device}): {finding.get('message', '')}"


def _record_resume(args: argparse.Namespace) -> int:
    """verify.yml resumed the node: the drain of this txn ends and its findings are resolved."""
    from stethoscope.remediation.ledger import RESUME, Ledger, note_row

    with Store(args.dsn, args.database) as store:
        ledger = Ledger(store)
        if ledger.drain_of(args.node, args.txn) is None:
            say(f"verify: no drain of {args.node} under txn {args.txn} on record; nothing resumed")
            return EXIT_FINDINGS
        row = note_row(args.txn, RESUME, args.node, {"by": "verify"})
        ledger.write_action(row, row["finished_at"])
        ledger.resolve_txn(args.txn, row["finished_at"])
    print(json.dumps({"node": args.node, "txn_id": args.txn, "resumed": True}, sort_keys=True))
    return EXIT_OK
