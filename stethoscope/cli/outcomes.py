"""`stethoscope outcomes [--since 30d] [--json]` (docs/design.md "CLI"): per ISO week and layer, how
long from first evidence to finding (MTTD), to isolation and to ticket, and how incidents ended."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stethoscope.cli.common import Subcommands, catalog_for, checked_rules, inventory_of, usage
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.report.outcomes import outcomes
from stethoscope.report.outcomes_table import render
from stethoscope.report.summary import initialised
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.timeutil import moment_ms, now_ms, to_ms


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "outcomes",
        help="per week and layer: time to detect, isolate and ticket; repairs and escalations",
        parents=parents,
    )
    parser.add_argument(
        "--since",
        default="30d",
        help="incidents begun since: a duration ago (30d), ISO-8601 or epoch seconds",
    )
    parser.add_argument("--until", help="incidents begun until: ISO-8601 or epoch seconds (default now)")
    parser.add_argument("--json", action="store_true", help="print them as JSON (stable keys)")
    parser.add_argument(
        "--rules", type=Path, help="rule file or folder (default rules/): the layers, windows"
    )
    parser.add_argument(
        "--inventory",
        type=Path,
        help="use its report intervals, the rules' windows (or $STETHOSCOPE_INVENTORY)",
    )
    parser.set_defaults(func=outcomes_command)


def _moment(text: str, until_ms: int) -> int | None:
    """A duration before `until_ms`, or a moment (ISO-8601, epoch seconds); None if neither."""
    try:
        return moment_ms(text, until_ms)
    except (ValueError, OverflowError):
        return None


def outcomes_command(args: argparse.Namespace) -> int:

    until_ms = now_ms()
    if args.until:
        try:
            until_ms = to_ms(args.until)
        except (ValueError, OverflowError):
            return usage(f"outcomes: --until {args.until!r}: neither ISO-8601 nor epoch seconds")
    since_ms = _moment(args.since, until_ms)
    if since_ms is None:
        return usage(
            f"outcomes: --since {args.since!r}: neither a duration (30d), ISO-8601 nor epoch seconds"
        )
    if since_ms > until_ms:
        return usage(f"outcomes: --since {args.since!r} is after --until")
    catalog = catalog_for(inventory_of(args))
    rules = checked_rules(args.rules, catalog, "outcomes").rules
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return usage(f"outcomes: no schema in {redact(store.dsn)}: run `stethoscope db init` first")
        result = outcomes(store, rules, catalog, since_ms, until_ms)
    print(json.dumps(result.as_dict(), indent=1) if args.json else render(result))
    return EXIT_OK
