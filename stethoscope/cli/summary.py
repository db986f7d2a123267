"""`stethoscope summary`: per node, the samples stored (counted from the hourly rollup) and the findings
diagnose gives."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from stethoscope.cli.common import (
    FRESH_HELP,
    Subcommands,
    catalog_for,
    checked_rules,
    fleet_of,
    hosts_of,
    inventory_of,
    model_of,
    model_options,
    print_json,
    usage,
)
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    summary = commands.add_parser(
        "summary", help="per node: samples stored and the findings diagnose gives", parents=parents
    )
    summary.add_argument(
        "--inventory",
        type=Path,
        help="only this inventory's hosts (or $STETHOSCOPE_INVENTORY; without one: every stored node)",
    )
    summary.add_argument("--at", help="evaluation time, ISO-8601 or epoch seconds (default now)")
    summary.add_argument("--fresh", action="store_true", help=FRESH_HELP)
    summary.add_argument("--json", action="store_true", help="print the nodes as JSON")
    model_options(summary)
    summary.set_defaults(func=summary_command)


def summary_command(args: argparse.Namespace) -> int:
    from stethoscope.cli.diagnose import serves_evaluation
    from stethoscope.report.summary import initialised, render, summarize
    from stethoscope.timeutil import iso, now_ms, to_ms

    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        return usage(f"summary: --at {args.at!r} is neither ISO-8601 nor epoch seconds")
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = checked_rules(None, catalog, "summary").rules
    model = model_of(args, inventory, "summary")
    published = None if args.at else serves_evaluation(args, inventory, rules, model)
    findings = None if published is None else [f for f in published.findings if not f.get("held")]
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return usage(
                f"summary: no schema in {redact(store.dsn)} (database {store.database}): "
                "run `stethoscope db init` first"
            )
        summaries = summarize(
            store, catalog, rules, at_ms, hosts_of(inventory), model, fleet_of(inventory), findings
        )
    if args.json:
        return print_json({"at": iso(at_ms), "nodes": [asdict(summary) for summary in summaries]})
    print(render(summaries))
    return EXIT_OK
