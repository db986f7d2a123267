"""`stethoscope audit [--faults FILE] [--lead-target 30m] [--out DIR] [--json] [--no-model]`
(docs/design.md "Reports and audit"): how far ahead the diagnosis warned of the faults `stethoscope
fault` recorded; exit 1 when a fault kind's median lead is under the target."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stethoscope.bounded_yaml import is_stdin
from stethoscope.cli.common import (
    Subcommands,
    catalog_for,
    checked_rules,
    inventory_of,
    model_of,
    model_options,
    say,
    usage,
)
from stethoscope.cli.exit_codes import EXIT_FINDINGS, EXIT_OK
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.timeutil import DURATION_SYNTAX, DurationError, parse_duration


def lead_minutes(text: str) -> float | None:
    """A duration ('30m', '1.5h', '1d', '90s', plain seconds) in minutes; None when it is not one."""
    try:
        return parse_duration(text) / 60
    except DurationError:
        return None


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    audit = commands.add_parser(
        "audit", help="how many minutes ahead the diagnosis warned of past faults", parents=parents
    )
    audit.add_argument("--faults", type=Path, help="import this YAML/JSON/CSV faults file first")
    audit.add_argument("--lead-target", default="30m", help="exit 1 when a kind's median lead is under it")
    audit.add_argument("--out", type=Path, help="write DIR/audit.html (beside the board)")
    audit.add_argument("--json", action="store_true", help="print the audit as JSON")
    audit.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    audit.add_argument("--inventory", type=Path, help="use its report intervals (or $STETHOSCOPE_INVENTORY)")
    model_options(audit, no_model_help="audit the rules alone")
    audit.set_defaults(func=audit_command)


def audit_command(args: argparse.Namespace) -> int:
    from stethoscope.diagnosis.audit import render, run_audit
    from stethoscope.store import fault_file
    from stethoscope.store.faults import known_nodes, latest_sample_ms, list_faults, record

    target = lead_minutes(args.lead_target)
    if target is None:
        return usage(f"audit: --lead-target {args.lead_target!r}: not a duration ({DURATION_SYNTAX})")
    if args.faults is not None and not is_stdin(args.faults) and not args.faults.is_file():
        return usage(f"audit: --faults {args.faults}: no such file")
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = checked_rules(args.rules, catalog, "audit").rules
    model = model_of(args, inventory, "audit")  # the whole diagnosis is audited: rules and model
    with Store(args.dsn, args.database) as store:
        store.ensure_schema()
        if args.faults is not None:
            parsed = fault_file.parse(args.faults, known_nodes(store), latest_sample_ms(store))
            for error in parsed.errors:
                say(f"audit: {error}")
            if parsed.errors:
                return usage(f"audit: {len(parsed.errors)} problems in {args.faults}; nothing imported")
            for fault in parsed.faults:
                record(store, fault)
            print(f"imported {len(parsed.faults)} faults from {args.faults}", file=sys.stderr)
        faults = list_faults(store)
        if args.faults is not None:  # the file's faults are the ones audited
            wanted = {f.fault_id for f in parsed.faults}
            faults = [f for f in faults if f.fault_id in wanted]
        audit = run_audit(store, faults, rules, catalog, target, model=model)
    if args.out:
        from stethoscope.report.audit_html import write

        page = write(audit, args.out, redact(store.dsn))
        print(f"wrote {page}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(audit.as_dict(), indent=2))
    elif not args.out:
        print(render(audit))
    return EXIT_FINDINGS if audit.under_target else EXIT_OK
