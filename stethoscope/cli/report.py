"""The `top` and `report` subcommands (docs/design.md "Reports and audit")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.cli.common import Subcommands, model_of, model_options, usage
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.store.client import Store
from stethoscope.terminal import colour_wanted
from stethoscope.timeutil import days_option, now_ms, whole_days_option


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    top = commands.add_parser(
        "top", help="fleet-wide top-K nodes of a metric over the last days", parents=parents
    )
    top.add_argument("metric", help="a catalog metric name, e.g. nvlink_error_rate_percent")
    top.add_argument(
        "--days",
        type=days_option,
        default=7,
        help="window ending now, in days or a duration: 7, 36h (default 7)",
    )
    top.add_argument("--limit", type=int, default=10, help="how many nodes (default 10)")
    top.add_argument("--device", metavar="GLOB", help="only devices matching this glob, e.g. 'gpu*'")
    top.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="only series with this label (repeatable)"
    )
    top.add_argument("--json", action="store_true", help="print the entries as JSON")
    top.set_defaults(func=top_command)

    report = commands.add_parser("report", help="the health board: nodes x days x layer", parents=parents)
    report.add_argument("--out", type=Path, help="write DIR/index.html (default: a terminal table)")
    report.add_argument(
        "--days", type=whole_days_option, default=7, help="days shown, ending today: 7, 2w (default 7)"
    )
    model_options(report, no_model_help="today's column from the rules alone")
    report.add_argument("--json", action="store_true", help="print the board as JSON (with --out too)")
    report.set_defaults(func=report_command)


def top_command(args: argparse.Namespace) -> int:
    from stethoscope.report import top

    catalog = Catalog.load()
    if args.metric not in catalog:
        return usage(f"top: {args.metric!r} is not in the metric catalog (rules/metrics.yml)")
    if args.limit <= 0:
        return usage("top: --limit must be positive")
    try:
        labels = top.parse_labels(args.label)
    except ValueError as exc:
        return usage(f"top: {exc}")
    with Store(args.dsn, args.database) as store:
        entries = top.top(
            store, catalog, args.metric, top.window_of(args.days, now_ms()), args.limit, args.device, labels
        )
    if args.json:
        print(json.dumps([entry.as_dict() for entry in entries], indent=2, default=str))
    else:
        print(top.render(entries, args.metric, top.is_cumulative(catalog, args.metric)))
    return EXIT_OK


def report_command(args: argparse.Namespace) -> int:
    from stethoscope.report.board import board_record, collect, render_terminal, write

    model = model_of(args, None, "report")
    with Store(args.dsn, args.database) as store:
        data = collect(store, Catalog.load(), args.days, now_ms(), model=model)
    if args.out:
        path = write(data, args.out)
        print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(board_record(data), indent=1, sort_keys=True, default=str))
    elif not args.out:
        print(render_terminal(data, color=colour_wanted(sys.stdout)))
    return EXIT_OK
