"""`stethoscope silence add|list|expire` (docs/design.md "CLI"): silences as Alertmanager users know
them. `add` prints the new silence's id alone (as amtool does), for scripts."""

from __future__ import annotations

import argparse
import json

from stethoscope.cli.common import Subcommands, usage, user
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.diagnosis.rules import parse_duration
from stethoscope.remediation.silence_table import add_silence, expire_silence, has_table, read_silences
from stethoscope.remediation.silences import Matcher, Silence, parse_matcher
from stethoscope.report.summary import initialised
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.terminal import aligned, terminal_safe
from stethoscope.timeutil import iso, now_ms


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    silence = commands.add_parser(
        "silence", help="silence findings for a while: no action, recorded as silenced", parents=parents
    )
    sub = silence.add_subparsers(dest="silence_command", required=True)
    add = sub.add_parser("add", help="a new silence; prints its id", parents=parents)
    add.set_defaults(func=run_add)
    add.add_argument(
        "--node",
        action="append",
        default=[],
        help="the node: NODE exactly (one; a regex: --match node_id=~RE)",
    )
    add.add_argument(
        "--rule",
        action="append",
        default=[],
        help="the rule: RULE exactly (one; a regex: --match rule_id=~RE)",
    )
    add.add_argument(
        "--match",
        action="append",
        default=[],
        help="KEY=VALUE or KEY=~REGEX (anchored), KEY one of node_id, rule_id, device (repeatable, ANDed)",
    )
    add.add_argument("--for", dest="duration", required=True, help="how long: 30m, 4h, 2d")
    add.add_argument("--reason", required=True, help="why (shown in every silenced finding's outcome)")
    add.add_argument("--by", help="who (default: the user running the command)")
    listing = sub.add_parser("list", help="the active silences", parents=parents)
    listing.set_defaults(func=run_list)
    listing.add_argument("--all", action="store_true", help="expired ones too")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    expire = sub.add_parser("expire", help="end a silence now", parents=parents)
    expire.set_defaults(func=run_expire)
    expire.add_argument("silence_id", help="the silence's id (`silence list` shows it)")


def run_add(args: argparse.Namespace) -> int:
    made = _request(args)
    if isinstance(made, str):
        return usage(terminal_safe(f"silence add: {made}"))
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return _no_schema(store)
        if not has_table(store):
            store.ensure_schema()  # a database from before silences: the table is added
        matchers, seconds, reason = made
        print(add_silence(store, matchers, seconds, args.by or user(), reason).silence_id)
    return EXIT_OK


def run_list(args: argparse.Namespace) -> int:
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return _no_schema(store)
        return _list(read_silences(store, None if args.all else now_ms()), args.json)


def run_expire(args: argparse.Namespace) -> int:
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return _no_schema(store)
        known = {s.silence_id: s for s in read_silences(store)}
        found = known.get(args.silence_id)
        if found is None:
            return usage(
                terminal_safe(
                    f"silence expire: no silence {args.silence_id!r} (`stethoscope silence list --all`)"
                )
            )
        if not found.active(now_ms()):
            print(terminal_safe(f"silence {found.silence_id} had already ended at {iso(found.ends_ms)}"))
            return EXIT_OK
        ended = expire_silence(store, found)
    print(terminal_safe(f"silence {ended.silence_id} expired at {iso(ended.ends_ms)}"))
    return EXIT_OK


def _no_schema(store: Store) -> int:
    return usage(terminal_safe(f"silence: no schema in {redact(store.dsn)}: run `stethoscope db init` first"))


def _request(args: argparse.Namespace) -> tuple[tuple[Matcher, ...], int, str] | str:
    """The matchers, duration and reason asked for, or what is wrong with them."""
    if not (args.node or args.rule or args.match):
        return "give at least one of --node, --rule, --match"
    matchers = [Matcher("node_id", "=", n) for n in args.node] + [
        Matcher("rule_id", "=", r) for r in args.rule
    ]
    try:
        matchers += [parse_matcher(m) for m in args.match]
    except ValueError as exc:
        return str(exc)
    exact: dict[str, Matcher] = {}
    for m in (m for m in matchers if m.op == "="):  # ANDed: two values of one key match nothing
        other = exact.setdefault(m.key, m)
        if other.value != m.value:
            return (
                f"{other} and {m} can never both match (matchers are ANDed): "
                "one silence a node or rule, or --match KEY=~A|B"
            )
    seconds = parse_duration(args.duration)
    if not seconds:
        return f"--for {args.duration!r} is not a duration such as 30m, 4h or 2d"
    if not args.reason.strip():
        return "--reason must say why (it is shown with every finding it silences)"
    return tuple(matchers), seconds, args.reason.strip()


def _list(silences: list[Silence], as_json: bool) -> int:
    if as_json:
        print(json.dumps([s.as_dict() for s in silences], indent=1))
        return EXIT_OK
    if not silences:
        print("no active silences")
        return EXIT_OK
    rows = [["ID", "ENDS", "BY", "MATCHERS", "REASON"]]
    rows += [
        [s.silence_id, iso(s.ends_ms), s.created_by, " ".join(str(m) for m in s.matchers), s.reason]
        for s in silences
    ]
    print("\n".join(aligned(rows)))
    return EXIT_OK
