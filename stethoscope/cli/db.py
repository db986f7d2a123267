"""`stethoscope db init|ddl`: the database schema."""

from __future__ import annotations

import argparse

from stethoscope.cli.common import Subcommands, print_json, spool_dir_of
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.cli.spool import print_replay, replay_record, say_spool_problems
from stethoscope.store.client import Store
from stethoscope.store.cluster import cluster_name
from stethoscope.store.dsn import database_name, redact
from stethoscope.store.spool import Spool
from stethoscope.timeutil import whole_days_option


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    db = commands.add_parser("db", help="database schema", parents=parents)
    db_commands = db.add_subparsers(dest="db_command", required=True)
    init = db_commands.add_parser("init", help="create the tables (idempotent)", parents=parents)
    init.add_argument(
        "--ttl-days",
        type=whole_days_option,
        help="raw TTL of metrics and facts in whole days, >= 1: 30, 2w (default 30; on an existing database: "
        "changes it)",
    )
    init.add_argument("--json", action="store_true", help="print what was done as JSON")
    init.add_argument(
        "--cluster",
        metavar="NAME",
        type=_cluster,
        help="create the Replicated + Distributed variant ON CLUSTER NAME",
    )
    init.set_defaults(func=db_init)
    ddl = db_commands.add_parser("ddl", help="print the DDL", parents=parents)
    ddl.add_argument(
        "--cluster", metavar="NAME", type=_cluster, help="print the Replicated + Distributed variant"
    )
    ddl.set_defaults(func=db_ddl)


def _cluster(value: str) -> str:
    try:
        return cluster_name(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def db_ddl(args: argparse.Namespace) -> int:
    from stethoscope.store.schema import cluster_ddl, single_node_ddl

    database = database_name(args.database)
    statements = cluster_ddl(database, args.cluster) if args.cluster else single_node_ddl(database)
    print(";\n\n".join(statements) + ";")
    return EXIT_OK


def db_init(args: argparse.Namespace) -> int:
    from stethoscope.store.cluster import init_cluster_schema, refuse_embedded, refuse_other_layout
    from stethoscope.store.sort_keys import node_first_tables
    from stethoscope.store.ttl import DEFAULT_RAW_TTL_DAYS, change_raw_ttl, raw_ttl_days

    store = Store(args.dsn, args.database)
    if args.cluster:
        refuse_embedded(store.dsn, args.cluster)
    with store:
        refuse_other_layout(store, args.cluster)
        before = raw_ttl_days(store)
        if args.cluster:
            init_cluster_schema(store, args.cluster, args.ttl_days or before or DEFAULT_RAW_TTL_DAYS)
            upgraded = []
        else:
            statements = store.init_schema(args.ttl_days or before or DEFAULT_RAW_TTL_DAYS)
            upgraded = [s.split()[2] for s in statements if " MODIFY QUERY " in s]
        changed = []
        if before is not None and args.ttl_days is not None and args.ttl_days != before:
            changed = change_raw_ttl(store, args.ttl_days, args.cluster)
        node_first = node_first_tables(store)
        replayed = Spool(spool_dir_of(args)).replay(store)
    if args.json:
        say_spool_problems(replayed)
        return print_json(
            {
                "dsn": redact(store.dsn),
                "database": store.database,
                "cluster": args.cluster,
                "raw_ttl_days": args.ttl_days or before or DEFAULT_RAW_TTL_DAYS,
                "raw_ttl_changed_from": before if changed else None,
                "tables_changed": changed,
                "views_upgraded": upgraded,
                "sorted_node_first": node_first,
                "replayed": replay_record(replayed),
            }
        )
    on_cluster = f" on cluster {args.cluster}" if args.cluster else ""
    print(f"schema ready in {redact(store.dsn)} (database {store.database}{on_cluster})")
    if changed:
        print(f"raw TTL changed from {before} to {args.ttl_days} days ({', '.join(changed)})")
    elif before is not None:
        print(f"raw TTL {before} days (unchanged)")
    if upgraded:
        print(
            f"rollup views given the current query: {', '.join(upgraded)} (the same rows, a cheaper insert)"
        )
    if node_first:
        print(
            f"sorted node first, as created before 2026-12-07: {', '.join(node_first)} (kept: the rules "
            "read them at the old cost, about twice the CPU at 2,000 nodes; a new database is sorted "
            'metric first, docs/design.md "Storage")'
        )
    print_replay(replayed)
    return EXIT_OK
