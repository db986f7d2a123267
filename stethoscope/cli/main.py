"""The `stethoscope` command. Exit codes: 0 healthy, 1 findings, 2 usage or config error, 3 the run
itself failed (a crash is never reported as findings)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import asdict
from pathlib import Path

from stethoscope.bounded_yaml import is_stdin
from stethoscope.catalog import Catalog, CatalogError
from stethoscope.cli import breaker as breaker_commands
from stethoscope.cli import fault as fault_commands
from stethoscope.cli import incidents as incident_commands
from stethoscope.cli import model as model_commands
from stethoscope.cli import outcomes as outcome_commands
from stethoscope.cli import report as report_commands
from stethoscope.cli import rules_sql, telemetry
from stethoscope.cli import silence as silence_commands
from stethoscope.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from stethoscope.cli.version import PrintVersions
from stethoscope.diagnosis.engine import readers_wanted
from stethoscope.paths import default_spool_dir
from stethoscope.store.client import SchemaMissing, Store, StoreError
from stethoscope.store.dsn import ConfigError, redact
from stethoscope.store.ingest import parse_ndjson
from stethoscope.store.spool import FileStatus, ReplayReport, Spool
from stethoscope.store.writer import Writer
from stethoscope.telemetry import gate as slurm_gate
from stethoscope.timeutil import duration_option

PACKAGE = Path(__file__).resolve().parent.parent
FRESH_HELP = "evaluate now, even beside a serve that published this evaluation in its last cycle"


def _global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--dsn, --database, --spool-dir, --debug: on the top parser (default None) and on every
    subcommand (default SUPPRESS, so that a value given before the subcommand is not overwritten)."""
    parser.add_argument(
        "--dsn", default=default, help="clickhouse-connect DSN (default $STETHOSCOPE_DSN, else embedded)"
    )
    parser.add_argument("--database", default=default, help="database name (default stethoscope)")
    parser.add_argument(
        "--spool-dir", type=Path, default=default, help="spool folder (default .stethoscope/spool)"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default if default is argparse.SUPPRESS else False,
        help="print the traceback of an internal error (or STETHOSCOPE_DEBUG=1)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stethoscope", description=__doc__)
    parser.add_argument("--version", action=PrintVersions)
    _global_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    init = db_commands.add_parser("init", help="create the tables (idempotent)")
    init.add_argument(
        "--ttl-days",
        type=int,
        help="raw TTL of metrics and facts in days, >= 1 (default 30; on an existing database: changes it)",
    )
    init.add_argument("--json", action="store_true", help="print what was done as JSON")
    ddl = db_commands.add_parser("ddl", help="print the DDL")
    ddl.add_argument("--cluster", metavar="NAME", help="print the Replicated + Distributed variant")

    ingest = commands.add_parser("ingest", help="store metric rows from an NDJSON file (- for stdin)")
    ingest.add_argument("file", type=Path, help="NDJSON file, or - to read standard input")

    summary = commands.add_parser("summary", help="per node: rows stored and the findings diagnose gives")
    summary.add_argument("--inventory", type=Path, help="only this inventory's hosts")
    summary.add_argument("--at", help="evaluation time, ISO-8601 or epoch seconds (default now)")
    summary.add_argument("--fresh", action="store_true", help=FRESH_HELP)
    summary.add_argument("--json", action="store_true", help="print the nodes as JSON")
    model_options(summary)

    baseline = commands.add_parser("baseline", help="graded benchmark report against fleet and own history")
    baseline.add_argument("--out", type=Path, help="also write DIR/baseline.html")
    baseline.add_argument("--all", action="store_true", help="print every row (per-size NCCL rows too)")
    baseline.add_argument("--node", help="only this node's rows (still graded against its whole class)")
    baseline.add_argument("--json", action="store_true", help="print the rows as JSON")

    diagnose = commands.add_parser("diagnose", help="evaluate the rules over ClickHouse (dry-run)")
    diagnose.add_argument("--at", help="evaluation time, ISO-8601 or epoch seconds (default now)")
    diagnose.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    diagnose.add_argument("--json", action="store_true", help="print the findings as JSON")
    diagnose.add_argument(
        "--fail-on",
        default="critical",
        choices=["info", "warning", "critical"],
        help="exit 1 when a finding is at or above this severity (default critical)",
    )
    diagnose.add_argument(
        "--plan",
        action="store_true",
        help="say per incident what --execute would do now (drain, ticket, refused...); acts on nothing",
    )
    diagnose.add_argument("--fresh", action="store_true", help=FRESH_HELP)
    _execution_options(diagnose)
    model_options(diagnose)

    watch = commands.add_parser("watch", help="diagnose periodically, re-reading changed rule files")
    watch.add_argument(
        "--interval", type=duration_option, default=60.0, help="between cycles: 90s, 5m... (default 60 s)"
    )
    watch.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    watch.add_argument("--json", action="store_true", help="print the findings as JSON")
    watch.add_argument(
        "--cycles", type=int, default=0, help="stop after N cycles (default: run until stopped)"
    )
    _execution_options(watch)
    model_options(watch)

    verify = commands.add_parser(
        "verify", help="after a repair: is the node's drain ours, and is its new benchmark green?"
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

    rules = commands.add_parser("rules", help="the diagnosis rules")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_commands.add_parser(
        "check", help="validate a rule file or folder: file:line, field, problem"
    )
    check.add_argument(
        "path", type=Path, help="rule file or folder, or - to read one rule file from standard input"
    )
    check.add_argument("--inventory", type=Path, help="use its report intervals (stethoscope_sweep_interval)")
    check.add_argument("--json", action="store_true", help="print the rules, files, errors and notes as JSON")
    schema = rules_commands.add_parser(
        "schema", help="print the path of the JSON Schema of a rule file or metrics.yml (editors, pre-commit)"
    )
    schema.add_argument("of", nargs="?", choices=("rules", "metrics"), default="rules")
    rules_sql.add_parser(rules_commands)

    spool = commands.add_parser("spool", help="the spool of rows not yet stored")
    spool_commands = spool.add_subparsers(dest="spool_command", required=True)
    spool_status = spool_commands.add_parser(
        "status", help="per file: target database, rows, age, attempts; quarantine"
    )
    spool_status.add_argument("--json", action="store_true", help="print the spool's state as JSON")
    replay = spool_commands.add_parser("replay", help="write this database's spooled rows to it now")
    replay.add_argument(
        "--into", metavar="DSN", help="move every spooled file into this DSN, whatever it was written for"
    )
    replay.add_argument("--json", action="store_true", help="print the rows and files replayed as JSON")
    telemetry.add_commands(commands)
    report_commands.register(commands)
    model_commands.register(commands)
    fault_commands.register(commands)
    breaker_commands.register(commands)
    incident_commands.register(commands)
    silence_commands.register(commands)
    outcome_commands.register(commands)
    gate = commands.add_parser(
        "gate", help="Slurm's health check: exit 1 and drain when the node's verdict fails (no verdict: said)"
    )
    slurm_gate.add_arguments(gate)
    _share_global_options(parser)
    return parser


def _share_global_options(parser: argparse.ArgumentParser) -> None:
    """Every subcommand, at any depth, takes the global options too, after its name; their default is
    SUPPRESS there, so that a value given before the subcommand is not overwritten."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _global_options(subparser, argparse.SUPPRESS)
                _share_global_options(subparser)


def model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        metavar="JSON",
        help="the learned model's metadata, its graphs beside it (default core12.json: the state "
        "folder's models/ where `model finetune` wrote it, else the shipped rules/models/)",
    )
    parser.add_argument(
        "--no-model", action="store_true", help="rules only: without the learned model's findings"
    )


def _execution_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--execute", action="store_true", help="carry out the actions (default: dry-run)")
    parser.add_argument(
        "--inventory",
        type=Path,
        help="inventory of the nodes (or $STETHOSCOPE_INVENTORY; a dry run without one: every stored node)",
    )
    parser.add_argument(
        "-e",
        "--extra-var",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting or template variable, over the inventory's (repeatable)",
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        readers_wanted()  # STETHOSCOPE_READERS checked first: a bad value is exit 2, not a failed cycle
        return _run(args)
    except (ConfigError, CatalogError) as exc:
        print(f"stethoscope: {redact(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except SchemaMissing as exc:  # before StoreError, its base: a missing schema is the user's to create
        print(f"stethoscope: {redact(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"stethoscope: {redact(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except BrokenPipeError:  # `stethoscope baseline | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_FAILED
    except Exception as exc:  # a crash is a failed run (3), never "findings" (1); one line unless --debug
        if args.debug or os.environ.get("STETHOSCOPE_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(PACKAGE)]
        where = (ours or frames)[-1]
        print(
            f"stethoscope: internal error: {type(exc).__name__}: {redact(str(exc))} "
            f"(at {Path(where.filename).name}:{where.lineno}; "
            "--debug or STETHOSCOPE_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    spool_dir = args.spool_dir or default_spool_dir()
    if args.command == "db" and args.db_command == "ddl":
        from stethoscope.store.schema import cluster_ddl, single_node_ddl

        database = args.database or "stethoscope"
        statements = cluster_ddl(database, args.cluster) if args.cluster else single_node_ddl(database)
        print(";\n\n".join(statements) + ";")
        return EXIT_OK
    if args.command == "db":
        return _db_init(args, spool_dir)
    if args.command == "ingest":
        return _ingest(args, spool_dir)
    if args.command in ("diagnose", "watch"):
        from stethoscope.cli.diagnose import diagnose_command, watch_command

        return diagnose_command(args) if args.command == "diagnose" else watch_command(args)
    if args.command == "verify":
        from stethoscope.cli.verify import verify_command

        return verify_command(args)
    if args.command == "gate":  # the node's gate.py, run here: never reaches the database
        return slurm_gate.run(args)
    if args.command in telemetry.COMMANDS:
        return telemetry.run(args)
    if args.command == "rules":
        if args.rules_command == "sql":
            return rules_sql.rules_sql_command(args)
        return _rules_schema(args) if args.rules_command == "schema" else _rules_check(args)
    if args.command == "baseline":
        return _baseline(args)
    if args.command == "summary":
        return _summary(args)
    if args.command in report_commands.COMMANDS:
        return report_commands.run(args)
    if args.command in model_commands.COMMANDS:
        return model_commands.run(args)
    if args.command in fault_commands.COMMANDS:
        return fault_commands.run(args)
    if args.command in breaker_commands.COMMANDS:
        return breaker_commands.run(args)
    if args.command in incident_commands.COMMANDS:
        return incident_commands.run(args)
    if args.command in silence_commands.COMMANDS:
        return silence_commands.run(args)
    if args.command in outcome_commands.COMMANDS:
        return outcome_commands.run(args)
    if args.spool_command == "status":
        return _spool_status(spool_dir, args.json)
    return _spool_replay(args, spool_dir)


def _db_init(args: argparse.Namespace, spool_dir: Path) -> int:
    from stethoscope.store.ttl import DEFAULT_RAW_TTL_DAYS, change_raw_ttl, raw_ttl_days

    if args.ttl_days is not None and args.ttl_days < 1:
        print(f"stethoscope: db init: --ttl-days {args.ttl_days}: must be 1 or more days", file=sys.stderr)
        return EXIT_USAGE
    with Store(args.dsn, args.database) as store:
        before = raw_ttl_days(store)
        store.init_schema(args.ttl_days or before or DEFAULT_RAW_TTL_DAYS)
        changed = []
        if before is not None and args.ttl_days is not None and args.ttl_days != before:
            changed = change_raw_ttl(store, args.ttl_days)
        replayed = Spool(spool_dir).replay(store)
    if args.json:
        _say_spool_problems(replayed)
        return _print_json(
            {
                "dsn": redact(store.dsn),
                "database": store.database,
                "raw_ttl_days": args.ttl_days or before or DEFAULT_RAW_TTL_DAYS,
                "raw_ttl_changed_from": before if changed else None,
                "tables_changed": changed,
                "replayed": _replay_record(replayed),
            }
        )
    print(f"schema ready in {redact(store.dsn)} (database {store.database})")
    if changed:
        print(f"raw TTL changed from {before} to {args.ttl_days} days ({', '.join(changed)})")
    elif before is not None:
        print(f"raw TTL {before} days (unchanged)")
    _print_replay(replayed)
    return EXIT_OK


def _print_json(document: object) -> int:
    """One JSON document on standard output, the --json of every command that reports."""
    print(json.dumps(document, indent=1, sort_keys=True, default=str))
    return EXIT_OK


def _replay_record(report: ReplayReport) -> dict[str, int]:
    return {"rows": report.rows, "files": report.files, "other_targets": report.other_targets}


def _say_spool_problems(report: ReplayReport) -> None:
    for problem in report.problems:
        print(f"stethoscope: spool: {problem}", file=sys.stderr)


def _print_replay(report: ReplayReport, always: bool = False) -> None:
    _say_spool_problems(report)
    if report.rows or always:
        print(f"replayed {report.rows} spooled rows from {report.files} files")
    if report.other_targets:
        print(
            f"{report.other_targets} spool files are for another database: left in place "
            "(`spool status` lists them; `spool replay --into DSN` moves them)"
        )


def _spool_status(spool_dir: Path, as_json: bool = False) -> int:
    spool = Spool(spool_dir)
    files = spool.status()
    if as_json:
        return _print_json(_spool_record(spool, files))
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


def _spool_replay(args: argparse.Namespace, spool_dir: Path) -> int:
    with Store(args.into or args.dsn, args.database) as store:
        store.ensure_schema()
        report = Spool(spool_dir).replay(store, into=bool(args.into))
    if args.json:
        _say_spool_problems(report)
        return _print_json(_replay_record(report))
    _print_replay(report, always=True)
    return EXIT_OK


def _summary(args: argparse.Namespace) -> int:
    from stethoscope.cli.diagnose import (
        catalog_for,
        checked_rules,
        fleet_of,
        hosts_of,
        inventory_of,
        model_of,
        serves_evaluation,
    )
    from stethoscope.report.summary import initialised, render, summarize
    from stethoscope.timeutil import iso, now_ms, to_ms

    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        print(
            f"stethoscope: summary: --at {args.at!r} is neither ISO-8601 nor epoch seconds", file=sys.stderr
        )
        return EXIT_USAGE
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = checked_rules(None, catalog, "summary").rules
    model = model_of(args, inventory, "summary")
    published = None if args.at else serves_evaluation(args, inventory, rules, model)
    findings = None if published is None else [f for f in published.findings if not f.get("held")]
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            print(
                f"stethoscope: summary: no schema in {redact(store.dsn)} (database {store.database}): "
                "run `stethoscope db init` first",
                file=sys.stderr,
            )
            return EXIT_USAGE
        summaries = summarize(
            store, catalog, rules, at_ms, hosts_of(inventory), model, fleet_of(inventory), findings
        )
    if args.json:
        return _print_json({"at": iso(at_ms), "nodes": [asdict(summary) for summary in summaries]})
    print(render(summaries))
    return EXIT_OK


def _rules_schema(args: argparse.Namespace) -> int:
    from stethoscope.paths import schema_path

    print(schema_path(args.of))
    return EXIT_OK


def _rules_check(args: argparse.Namespace) -> int:
    from stethoscope.cli.diagnose import catalog_for, inventory_of
    from stethoscope.diagnosis.rules import load_rules

    path = args.path
    if not is_stdin(path) and not path.exists():
        print(f"stethoscope: rules check: {path}: no such file or folder", file=sys.stderr)
        return EXIT_USAGE
    result = load_rules(path, catalog_for(inventory_of(args)))
    if args.json:
        _print_json(
            {
                "rules": len(result.rules),
                "rule_ids": [rule.rule_id for rule in result.rules],
                "files": result.files,
                "errors": [asdict(error) for error in result.errors],
                "notes": [asdict(note) for note in result.notes],
            }
        )
        return EXIT_USAGE if result.errors or not result.rules else EXIT_OK
    for error in result.errors:
        print(error, file=sys.stderr)
    for note in result.notes:
        print(note)
    stretched = f"; {len(result.notes)} windows stretched to their cadence" if result.notes else ""
    problems = f"{len(result.errors)} problems{stretched}"
    print(f"{len(result.rules)} rules valid in {result.files} files; {problems}")
    if not result.rules and not result.errors:
        print(f"stethoscope: rules check: no rules under {path}", file=sys.stderr)
    return EXIT_USAGE if result.errors or not result.rules else EXIT_OK


def _baseline(args: argparse.Namespace) -> int:
    from stethoscope.bench import baseline
    from stethoscope.private_files import private_dir, write_private
    from stethoscope.report.baseline_html import render_html

    with Store(args.dsn, args.database) as store:
        rows = baseline.build(store, Catalog.load())
    shown = rows if args.all else baseline.summary_rows(rows)
    if args.node:
        shown = [row for row in shown if row.node_id == args.node]
    if args.json:
        _print_json({"rows": [asdict(row) for row in shown]})
    else:
        print(baseline.render_table(shown))
    if args.out:
        private_dir(args.out)
        written = write_private(args.out / "baseline.html", render_html(rows))
        print(f"wrote {written}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_OK


def _ingest(args: argparse.Namespace, spool_dir: Path) -> int:
    from stethoscope.store.batch import Batch
    from stethoscope.store.hold import held_rows
    from stethoscope.store.ingest import FUTURE_TOLERANCE_MS, older_than
    from stethoscope.store.ttl import DEFAULT_RAW_TTL_DAYS, read_raw_ttl_days

    if str(args.file) != "-" and not args.file.is_file():
        print(f"stethoscope: ingest: {args.file}: no such file", file=sys.stderr)
        return EXIT_USAGE
    writer = Writer(args.dsn, spool_dir, database=args.database)  # a bad DSN stops here: exit 2
    parsed = parse_ndjson(args.file, Catalog.load())
    for error in parsed.errors:
        print(f"stethoscope: ingest: {error}", file=sys.stderr)
    if parsed.future:
        print(
            f"stethoscope: ingest: {len(parsed.future)} rows rejected: timestamp more than "
            f"{FUTURE_TOLERANCE_MS // 60_000} min in the future (first at {parsed.future[0]})",
            file=sys.stderr,
        )
    ttl_days = read_raw_ttl_days(writer.dsn, args.database) or DEFAULT_RAW_TTL_DAYS
    expiring = older_than(parsed.metrics, ttl_days)
    if expiring:
        print(
            f"stethoscope: ingest: warning: {expiring} rows are older than the raw TTL ({ttl_days} days): "
            "stored, but they expire at the next merge",
            file=sys.stderr,
        )
    report = writer.write(Batch(metrics=parsed.metrics))
    if held_rows(report.held):  # the store out and the spool's disk full or read-only
        print(
            f"stethoscope: ingest: {held_rows(report.held)} rows neither stored nor spooled: "
            f"{report.spool_error} (store: {report.error}); ingest the file again once there is room",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if report.error:
        print(
            f"stethoscope: ingest: {report.error}; {report.spooled} rows spooled in {spool_dir}",
            file=sys.stderr,
        )
    else:
        print(f"stored {report.stored} rows" + (f" (+{report.replayed} replayed)" if report.replayed else ""))
    return EXIT_USAGE if parsed.errors or parsed.future else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
