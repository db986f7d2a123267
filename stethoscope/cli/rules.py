"""`stethoscope rules check|schema|sql`: the diagnosis rules.

`rules sql RULE` prints the one query a rule compiles to (diagnosis.engine.rule_query), formatted by
ClickHouse itself (formatQuery, in a temporary session of its own), with the parameters it reads: what
`diagnose` runs for that rule, for the store named by --dsn (its database, raw TTL and the cadence its
series report at), at --at or now. Without a store (an embedded path that does not exist is not
created) the query for a new database."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from stethoscope.bounded_yaml import is_stdin
from stethoscope.cli.common import (
    Subcommands,
    catalog_for,
    checked_rules,
    hosts_of,
    inventory_of,
    print_json,
    say,
    usage,
)
from stethoscope.cli.exit_codes import EXIT_OK, EXIT_USAGE
from stethoscope.store.client import Store, StoreError, formatted_sql
from stethoscope.store.dsn import embedded_path, is_embedded, redact
from stethoscope.timeutil import iso, now_ms, to_ms

if TYPE_CHECKING:
    from stethoscope.diagnosis.rules import Rule


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    rules = commands.add_parser("rules", help="the diagnosis rules", parents=parents)
    rules_commands = rules.add_subparsers(dest="rules_command", required=True)
    check = rules_commands.add_parser(
        "check", help="validate a rule file or folder: file:line, field, problem", parents=parents
    )
    check.add_argument(
        "path", type=Path, help="rule file or folder, or - to read one rule file from standard input"
    )
    check.add_argument(
        "--inventory",
        type=Path,
        help="use its report intervals (stethoscope_sweep_interval; or $STETHOSCOPE_INVENTORY)",
    )
    check.add_argument("--json", action="store_true", help="print the rules, files, errors and notes as JSON")
    check.set_defaults(func=rules_check)
    schema = rules_commands.add_parser(
        "schema",
        help="print the path of the JSON Schema of a rule file or metrics.yml (editors, pre-commit)",
        parents=parents,
    )
    schema.add_argument("of", nargs="?", choices=("rules", "metrics"), default="rules")
    schema.set_defaults(func=rules_schema)
    sql = rules_commands.add_parser(
        "sql", help="print the SQL a rule compiles to, formatted, with its parameters", parents=parents
    )
    sql.add_argument("rule_id", help="the rule's id (its rule_id, as findings name it)")
    sql.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    sql.add_argument("--at", help="evaluation time, ISO-8601 or epoch seconds (default now)")
    sql.add_argument(
        "--inventory",
        type=Path,
        help="only this inventory's hosts, its report intervals (or $STETHOSCOPE_INVENTORY)",
    )
    sql.add_argument("--json", action="store_true", help="print {rule_id, file, sql, parameters} as JSON")
    sql.set_defaults(func=rules_sql)


def rules_schema(args: argparse.Namespace) -> int:
    from stethoscope.paths import schema_path

    print(schema_path(args.of))
    return EXIT_OK


def rules_check(args: argparse.Namespace) -> int:
    from stethoscope.diagnosis.rules import load_rules

    path = args.path
    if not is_stdin(path) and not path.exists():
        return usage(f"rules check: {path}: no such file or folder")
    result = load_rules(path, catalog_for(inventory_of(args)))
    if args.json:
        print_json(
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
        say(f"rules check: no rules under {path}")
    return EXIT_USAGE if result.errors or not result.rules else EXIT_OK


def rules_sql(args: argparse.Namespace) -> int:
    from stethoscope.diagnosis.engine import rule_query
    from stethoscope.store.schema import DEFAULT_RAW_TTL_DAYS

    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        return usage(f"rules sql: --at {args.at!r} is neither ISO-8601 nor epoch seconds")
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = {rule.rule_id: rule for rule in checked_rules(args.rules, catalog, "rules sql").rules}
    rule = rules.get(args.rule_id)
    if rule is None:
        return usage(f"rules sql: no rule {args.rule_id!r} among the {len(rules)} rules loaded")
    store, hosts = Store(args.dsn, args.database), hosts_of(inventory)
    read = as_stored(store, rule, at_ms, hosts)
    if read is None:
        say("rules sql: no store read: the query for a new database (its raw TTL, the catalog's cadence)")
    ttl, fitted = read or (DEFAULT_RAW_TTL_DAYS * 86400, rule)
    sql, parameters = rule_query(fitted, store.database, at_ms, ttl, catalog, hosts)
    try:
        text = formatted_sql(sql)  # once the store is closed: one embedded session at a time
    except StoreError as exc:  # the query is what is asked for: shown as it runs, whatever formats it
        say(f"rules sql: not formatted ({exc}); the query as it runs")
        text = sql
    where = f"{rule.file}:{rule.line}"
    if args.json:
        shown = {"rule_id": rule.rule_id, "file": str(rule.file), "line": rule.line, "sql": text}
        shown |= {"parameters": parameters}
        print(json.dumps(shown, indent=1, default=str))
        return EXIT_OK
    scope = f"database {store.database}, raw TTL {ttl // 86400} days"
    print(f"-- {rule.rule_id} ({where}) at {iso(at_ms)}, {scope}")
    print(text)
    print("-- parameters")
    for name, value in parameters.items():
        print(f"--   {name} = {value!r}")
    return EXIT_OK


def as_stored(store: Store, rule: Rule, at_ms: int, hosts: list[str] | None) -> tuple[int, Rule] | None:
    """The store's raw TTL and `rule` fitted to the cadence its series report at, as `diagnose` reads
    them; None where no store was read (an embedded path that does not exist is not created)."""
    from stethoscope.diagnosis.cadence import Cadence
    from stethoscope.store.ttl import raw_ttl_seconds

    if is_embedded(store.dsn) and not Path(embedded_path(store.dsn)).exists():
        return None
    try:
        with store:
            ttl = raw_ttl_seconds(store)
            (fitted,) = Cadence.learn(store, at_ms, hosts).fit_all([rule])
            return ttl, fitted
    except StoreError as exc:
        say(f"rules sql: {redact(str(exc))}")
        return None
