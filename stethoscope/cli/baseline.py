"""`stethoscope baseline`: the graded benchmark report against the fleet and each node's own history."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.cli.common import Subcommands, print_json
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.store.client import Store


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    baseline = commands.add_parser(
        "baseline", help="graded benchmark report against fleet and own history", parents=parents
    )
    baseline.add_argument("--out", type=Path, help="also write DIR/baseline.html")
    baseline.add_argument("--all", action="store_true", help="print every row (per-size NCCL rows too)")
    baseline.add_argument("--node", help="only this node's rows (still graded against its whole class)")
    baseline.add_argument("--json", action="store_true", help="print the rows as JSON")
    baseline.set_defaults(func=baseline_command)


def baseline_command(args: argparse.Namespace) -> int:
    from stethoscope.bench import baseline
    from stethoscope.private_files import private_dir, write_private
    from stethoscope.report.baseline_html import render_html

    with Store(args.dsn, args.database) as store:
        rows = baseline.build(store, Catalog.load())
    shown = rows if args.all else baseline.summary_rows(rows)
    if args.node:
        shown = [row for row in shown if row.node_id == args.node]
    if args.json:
        print_json({"rows": [asdict(row) for row in shown]})
    else:
        print(baseline.render_table(shown))
    if args.out:
        private_dir(args.out)
        written = write_private(args.out / "baseline.html", render_html(rows))
        print(f"wrote {written}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK
