"""`stethoscope spool status|replay`: the spool of rows not yet stored."""

from __future__ import annotations

import argparse

from stethoscope.cli.common import Subcommands, print_json, say, spool_dir_of
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.store.client import Store
from stethoscope.store.spool import FileStatus, ReplayReport, Spool


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    spool = commands.add_parser("spool", help="the spool of rows not yet stored", parents=parents)
    spool_commands = spool.add_subparsers(dest="spool_command", required=True)
    status = spool_commands.add_parser(
        "status", help="per file: target database, rows, age, attempts; quarantine", parents=parents
    )
    status.add_argument("--json", action="store_true", help="print the spool's state as JSON")
    status.set_defaults(func=spool_status)
    replay = spool_commands.add_parser(
        "replay", help="write this database's spooled rows to it now", parents=parents
    )
    replay.add_argument(
        "--into", metavar="DSN", help="move every spooled file into this DSN, whatever it was written for"
    )
    replay.add_argument("--json", action="store_true", help="print the rows and files replayed as JSON")
    replay.set_defaults(func=spool_replay)


def replay_record(report: ReplayReport) -> dict[str, int]:
    return {"rows": report.rows, "files": report.files, "other_targets": report.other_targets}


def say_spool_problems(report: ReplayReport) -> None:
    for problem in report.problems:
        say(f"spool: {problem}")


def print_replay(report: ReplayReport, always: bool = False) -> None:
    say_spool_problems(report)
    if report.rows or always:
        print(f"replayed {report.rows} spooled rows from {report.files} files")
    if report.other_targets:
        print(
            f"{report.other_targets} spool files are for another database: left in place "
            "(`spool status` lists them; `spool replay --into DSN` moves them)"
        )


def spool_status(args: argparse.Namespace) -> int:
    spool_dir = spool_dir_of(args)
    spool = Spool(spool_dir)
    files = spool.status()
    if args.json:
        return print_json(_spool_record(spool, files))
    print(f"{sum(f.rows for f in files)} rows waiting in {spool_dir}")
    for f in files:
        tried = f"{f.attempts} failed attempts ({f.last_error})" if f.attempts else "0 attempts"
        print(f"  {f.path.name}  {f.table}  {f.rows} rows  {f.age_seconds:.0f} s old  {tried}  -> {f.target}")
    rejected, reasons = spool.rejected()
    if rejected:
        said = "; ".join(f"{reason}: {count}" for reason, count in reasons.most_common())
        print(f"{rejected} rows rejected ({spool.rejected_dir}; not deleted by stethoscope): {said}")
    quarantined = spool.quarantined()
    if quarantined:
        print(f"{len(quarantined)} files in quarantine ({spool.quarantine_dir}; not deleted by stethoscope):")
        for path, reason in quarantined:
            print(f"  {path.name}: {reason}")
    return EXIT_OK


def _spool_record(spool: Spool, files: list[FileStatus]) -> dict[str, object]:
    rejected, reasons = spool.rejected()
    return {
        "spool_dir": str(spool.dir),
        "rows": sum(f.rows for f in files),
        "files": [
            {
                "file": f.path.name,
                "table": f.table,
                "rows": f.rows,
                "age_seconds": round(f.age_seconds, 3),
                "attempts": f.attempts,
                "last_error": f.last_error or None,
                "target": f.target,
            }
            for f in files
        ],
        "rejected": {"rows": rejected, "reasons": dict(reasons)},
        "quarantined": [{"file": path.name, "reason": reason} for path, reason in spool.quarantined()],
    }


def spool_replay(args: argparse.Namespace) -> int:
    with Store(args.into or args.dsn, args.database) as store:
        store.ensure_schema()
        report = Spool(spool_dir_of(args)).replay(store, into=bool(args.into))
    if args.json:
        say_spool_problems(report)
        return print_json(replay_record(report))
    print_replay(report, always=True)
    return EXIT_OK
