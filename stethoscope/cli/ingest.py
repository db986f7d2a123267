"""`stethoscope ingest FILE`: store metric rows from an NDJSON file (- for stdin)."""

from __future__ import annotations

import argparse
from pathlib import Path

from stethoscope.catalog import Catalog
from stethoscope.cli.common import Subcommands, say, spool_dir_of, usage
from stethoscope.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from stethoscope.store.ingest import parse_ndjson
from stethoscope.store.writer import Writer


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    ingest = commands.add_parser(
        "ingest", help="store metric rows from an NDJSON file (- for stdin)", parents=parents
    )
    ingest.add_argument("file", type=Path, help="NDJSON file, or - to read standard input")
    ingest.set_defaults(func=ingest_command)


def ingest_command(args: argparse.Namespace) -> int:
    from stethoscope.store.batch import Batch
    from stethoscope.store.hold import held_rows
    from stethoscope.store.ingest import FUTURE_TOLERANCE_MS, older_than
    from stethoscope.store.ttl import DEFAULT_RAW_TTL_DAYS, read_raw_ttl_days

    spool_dir = spool_dir_of(args)
    if str(args.file) != "-" and not args.file.is_file():
        return usage(f"ingest: {args.file}: no such file")
    writer = Writer(args.dsn, spool_dir, database=args.database)  # a bad DSN stops here: exit 2
    parsed = parse_ndjson(args.file, Catalog.load())
    for error in parsed.errors:
        say(f"ingest: {error}")
    if parsed.future:
        say(
            f"ingest: {len(parsed.future)} rows rejected: timestamp more than "
            f"{FUTURE_TOLERANCE_MS // 60_000} min in the future (first at {parsed.future[0]})"
        )
    ttl_days = read_raw_ttl_days(writer.dsn, args.database) or DEFAULT_RAW_TTL_DAYS
    expiring = older_than(parsed.metrics, ttl_days)
    if expiring:
        say(
            f"ingest: warning: {expiring} rows are older than the raw TTL ({ttl_days} days): "
            "stored, but they expire at the next merge"
        )
    report = writer.write(Batch(metrics=parsed.metrics))
    if held_rows(report.held):  # the store out and the spool's disk full or read-only
        say(
            f"ingest: {held_rows(report.held)} rows neither stored nor spooled: "
            f"{report.spool_error} (store: {report.error}); ingest the file again once there is room"
        )
        return EXIT_FAILED
    if report.error:
        say(f"ingest: {report.error}; {report.spooled} rows spooled in {spool_dir}")
    else:
        print(f"stored {report.stored} rows" + (f" (+{report.replayed} replayed)" if report.replayed else ""))
    return EXIT_USAGE if parsed.errors or parsed.future else EXIT_OK
