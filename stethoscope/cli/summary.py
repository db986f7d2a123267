"""`stethoscope summary`: per node, the samples stored (counted from the hourly rollup) and the findings
diagnose gives."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

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
    from stethoscope.cli.diagnose import served_as_loaded, serves_evaluation
    from stethoscope.timeutil import now_ms, to_ms

    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        return usage(f"summary: --at {args.at!r} is neither ISO-8601 nor epoch seconds")
    served = served_as_loaded(args, None)
    if served is not None:
        result, nodes = served
        return _printed(args, at_ms, lambda store: unheld(result.findings), nodes)
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = checked_rules(None, catalog, "summary").rules
    model = model_of(args, inventory, "summary")
    published = None if args.at else serves_evaluation(args, inventory, rules, model)
    nodes = hosts_of(inventory)

    def findings(store: Store) -> list[dict[str, Any]]:
        from stethoscope.diagnosis.findings import diagnose

        if published is not None:
            return unheld(published.findings)
        return diagnose(store, rules, at_ms, catalog, nodes, fleet=fleet_of(inventory), model=model)

    return _printed(args, at_ms, findings, nodes)


def unheld(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """serve's findings as a dry run gives them: one serve holds open (not matched now) is not one."""
    return [f for f in findings if not f.get("held")]


def _printed(
    args: argparse.Namespace,
    at_ms: int,
    findings: Callable[[Store], list[dict[str, Any]]],
    nodes: list[str] | None,
) -> int:
    from stethoscope.report.summary import initialised, render, summarize
    from stethoscope.timeutil import iso

    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return usage(
                f"summary: no schema in {redact(store.dsn)} (database {store.database}): "
                "run `stethoscope db init` first"
            )
        summaries = summarize(store, findings(store), nodes)
    if args.json:
        return print_json({"at": iso(at_ms), "nodes": [asdict(summary) for summary in summaries]})
    print(render(summaries))
    return EXIT_OK
