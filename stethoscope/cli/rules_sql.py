"""`stethoscope rules sql RULE`: the one query a rule compiles to (diagnosis.engine.rule_query), formatted
by ClickHouse itself (formatQuery), with its parameters: what `diagnose` runs for that rule, for the store
named by --dsn (its database, raw TTL and the cadence its series report at), at --at or now. Without a
store (an embedded path that does not exist is not created) the query for a new database, unformatted."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stethoscope.cli.exit_codes import EXIT_OK, EXIT_USAGE
from stethoscope.diagnosis.cadence import Cadence
from stethoscope.diagnosis.engine import rule_query
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import embedded_path, is_embedded, redact
from stethoscope.store.schema import DEFAULT_RAW_TTL_DAYS
from stethoscope.store.ttl import raw_ttl_seconds
from stethoscope.timeutil import iso, now_ms, to_ms


def add_parser(rules_commands: Any) -> None:
    sql = rules_commands.add_parser(
        "sql", help="print the SQL a rule compiles to, formatted, with its parameters"
    )
    sql.add_argument("rule_id", help="the rule's id (rules check lists the files)")
    sql.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    sql.add_argument("--at", help="evaluation time, ISO-8601 or epoch seconds (default now)")
    sql.add_argument("--inventory", type=Path, help="only this inventory's hosts, its report intervals")
    sql.add_argument("--json", action="store_true", help="print {rule_id, file, sql, parameters} as JSON")


def rules_sql_command(args: argparse.Namespace) -> int:
    from stethoscope.cli.diagnose import catalog_for, checked_rules, hosts_of, inventory_of

    try:
        at_ms = to_ms(args.at) if args.at else now_ms()
    except ValueError:
        _say(f"--at {args.at!r} is neither ISO-8601 nor epoch seconds")
        return EXIT_USAGE
    inventory = inventory_of(args)
    catalog = catalog_for(inventory)
    rules = {rule.rule_id: rule for rule in checked_rules(args.rules, catalog, "rules sql").rules}
    rule = rules.get(args.rule_id)
    if rule is None:
        _say(f"no rule {args.rule_id!r} among the {len(rules)} rules loaded")
        return EXIT_USAGE
    store, hosts = Store(args.dsn, args.database), hosts_of(inventory)
    ttl, text = DEFAULT_RAW_TTL_DAYS * 86400, ""
    parameters: dict[str, Any] = {}
    if not is_embedded(store.dsn) or Path(embedded_path(store.dsn)).exists():  # never creates a database
        try:
            with store:
                ttl = raw_ttl_seconds(store)
                (fitted,) = Cadence.learn(store, at_ms, hosts).fit_all([rule])  # as diagnose runs it
                sql, parameters = rule_query(fitted, store.database, at_ms, ttl, catalog, hosts)
                text = str(store.query("SELECT formatQuery({sql:String})", {"sql": sql})[0][0])
        except StoreError as exc:
            _say(f"{redact(str(exc))}")
    if not text:  # no store to read: as the loader compiles it for a new database, unformatted
        _say("no store read: the query for a new database (its TTL, the catalog's cadence), unformatted")
        text, parameters = rule_query(rule, store.database, at_ms, ttl, catalog, hosts)
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


def _say(message: str) -> None:
    print(f"stethoscope: rules sql: {message}", file=sys.stderr)
