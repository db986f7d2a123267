"""`stethoscope diagnose`, `watch` and `verify`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from stethoscope.catalog import Catalog, CatalogError
from stethoscope.diagnosis.diagnose import SEVERITY_ORDER
from stethoscope.diagnosis.rules import load_rules
from stethoscope.diagnosis.ruleset import RuleSet
from stethoscope.inventory import Inventory, load_inventory
from stethoscope.paths import project_root
from stethoscope.remediation.cycle import run_cycle, worst
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms, to_ms

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def _say(message: str) -> None:
    print(f"stethoscope: {message}", file=sys.stderr)


def _overrides(pairs: list[str]) -> dict[str, Any] | None:
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            _say(f"-e {pair!r}: expected KEY=VALUE")
            return None
        overrides[key.strip()] = value
    return overrides


def inventory_of(args: argparse.Namespace) -> Inventory | None:
    """The inventory named by --inventory (or the lab's, to execute); errors exit 2."""
    if not (getattr(args, "execute", False) or args.inventory):
        return None
    try:
        return load_inventory(args.inventory)
    except Exception as exc:  # InventoryError, and ansible's own parse errors, which have many types
        _say(f"inventory: {exc}")
        raise SystemExit(EXIT_USAGE) from None


def catalog_for(inventory: Inventory | None) -> Catalog:
    """The catalog, with the inventory's report intervals where it sets them."""
    catalog = Catalog.load()
    if inventory is None:
        return catalog
    try:
        return catalog.with_intervals(
            inventory.settings.get("stethoscope_sweep_interval"),
            inventory.settings.get("stethoscope_metric_intervals") or {},
        )
    except CatalogError as exc:
        _say(f"inventory {inventory.path}: {exc}")
        raise SystemExit(EXIT_USAGE) from None


def _executor_factory(args: argparse.Namespace, inventory: Inventory | None):
    """None for a dry-run; else a function (dsn, database) -> execution Context. Errors exit 2."""
    if not args.execute or inventory is None:
        return None
    from stethoscope.paths import default_spool_dir
    from stethoscope.remediation.executor import Context

    overrides = _overrides(args.extra_var)
    if overrides is None:
        raise SystemExit(EXIT_USAGE)
    spool_dir = args.spool_dir or default_spool_dir()
    return lambda dsn, database: Context(dsn, database, inventory, overrides, spool_dir=spool_dir)


def diagnose_command(args: argparse.Namespace) -> int:
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    loaded = load_rules(args.rules or project_root() / "rules", catalog)
    for error in loaded.errors:  # an invalid rule is reported and skipped; the others still run
        _say(f"diagnose: {error}")
    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        _say(f"diagnose: --at {args.at!r} is neither ISO-8601 nor epoch seconds")
        return EXIT_USAGE
    factory = _executor_factory(args, inventory)
    findings = run_cycle(
        loaded.rules,
        catalog,
        at_ms,
        dsn=args.dsn,
        database=args.database,
        as_json=args.json,
        execute_with=factory,
    )
    return EXIT_FINDINGS if worst(findings) >= SEVERITY_ORDER[args.fail_on] else EXIT_OK


def watch_command(args: argparse.Namespace) -> int:
    from stethoscope.store.client import StoreError

    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = RuleSet(Path(args.rules or project_root() / "rules"), catalog)
    factory = _executor_factory(args, inventory)
    cycle = 0
    try:
        while True:
            cycle += 1
            for message in rules.refresh():
                _say(f"watch: {message}")
            try:
                run_cycle(
                    rules.rules,
                    catalog,
                    now_ms(),
                    dsn=args.dsn,
                    database=args.database,
                    as_json=args.json,
                    execute_with=factory,
                )
            except StoreError as exc:  # the database may come back: keep watching
                _say(f"watch: cycle {cycle}: {exc}")
            if args.cycles and cycle >= args.cycles:
                return EXIT_OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


def verify_command(args: argparse.Namespace) -> int:
    from stethoscope.bench import baseline
    from stethoscope.remediation.ledger import Ledger

    try:
        since_override = to_ms(args.since) if args.since else None
    except ValueError:
        _say(f"verify: --since {args.since!r} is neither ISO-8601 nor epoch seconds")
        return EXIT_USAGE
    with Store(args.dsn, args.database) as store:
        ledger = Ledger(store)
        drained_at = ledger.drain_of(args.node, args.txn)
        rule_id = ledger.rule_of_txn(args.txn)
        # the benchmark that counts is one run after the drain (or after --since)
        since_ms = since_override if since_override is not None else (drained_at or 0)
        result = baseline.verify(store, Catalog.load(), args.node, since_ms, now_ms())
    ours = drained_at is not None
    verdict = {
        "node": args.node,
        "txn_id": args.txn,
        "rule_id": rule_id,
        "drain_recorded": ours,
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
        "reasons": ([] if ours else [f"no drain of {args.node} recorded under {args.txn}"])
        + result["reasons"],
        "resume": ours and result["green"],
    }
    print(json.dumps(verdict, sort_keys=True))
    return EXIT_OK if verdict["resume"] else EXIT_FINDINGS
