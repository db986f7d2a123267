"""`stethoscope incidents [show TXN | ack TXN | unack TXN | repaired TXN]` and `stethoscope actions`
(docs/design.md "CLI"): the incidents diagnose --execute opened (one transaction each), what was
done for them, refused, failed or skipped, and why; who acknowledged them; the re-baselines planned,
waiting for their window, running or done (remediation.rebaseline). `repaired` marks an incident's
node repaired: the executor's next cycle verifies it (remediate/verify.yml) by itself."""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from typing import Any

from stethoscope.cli.common import Command, Subcommands, tell, usage, user
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.remediation.incident_view import Incident, acknowledge, incident, incidents, unacknowledge
from stethoscope.remediation.ledger import REBASELINE, ActionState, Ledger
from stethoscope.remediation.rebaseline import FINISHED, repaired_row
from stethoscope.remediation.record import recorded_findings
from stethoscope.remediation.retries import RETRIED, attempt_of, reason_of
from stethoscope.report.summary import initialised
from stethoscope.store.client import Store
from stethoscope.store.dsn import redact
from stethoscope.terminal import aligned
from stethoscope.timeutil import iso, moment_ms, now_ms

STATUSES = ("failed", "refused", "skipped", "ok", "planned", "in_flight", "expired", "waiting", "running")


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    listing = commands.add_parser(
        "incidents",
        help="the incidents --execute opened: one transaction, ticket and drain each",
        parents=parents,
    )
    listing.set_defaults(func=run_incidents)
    listing.add_argument("--all", action="store_true", help="resolved incidents too")
    listing.add_argument("--node", help="only this node's incidents")
    listing.add_argument("--json", action="store_true", help="print them as JSON")
    sub = listing.add_subparsers(dest="incidents_command")
    show = sub.add_parser(
        "show", help="an incident's findings and every action, its attempts and why", parents=parents
    )
    show.set_defaults(func=run_show)
    show.add_argument("txn", help="the incident's transaction id")
    # SUPPRESS: `incidents --json show T` keeps the group's --json
    show.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print it as JSON")
    _txn_command(
        sub,
        parents,
        "ack",
        run_ack,
        "free text",
        help="a person took the incident: its retries and alerts wait until it escalates or unack",
    )
    _txn_command(
        sub, parents, "unack", run_unack, None, help="withdraw the acknowledgement: retries and alerts go on"
    )
    _txn_command(
        sub,
        parents,
        "repaired",
        run_repaired,
        "free text (what was replaced)",
        help="the node was repaired: the executor's next cycle verifies it and resumes it if green",
    )

    actions = commands.add_parser(
        "actions", help="what was done, refused, failed or skipped, and why", parents=parents
    )
    actions.set_defaults(func=run_actions)
    actions.add_argument("--txn", help="only this transaction's actions")
    actions.add_argument("--status", choices=STATUSES, help="only actions whose latest status is this")
    actions.add_argument(
        "--since", help="started since: ISO-8601, epoch seconds, or a duration ago (2h, 1.5d, 1w)"
    )
    actions.add_argument("--json", action="store_true", help="print them as JSON")


def run_incidents(args: argparse.Namespace) -> int:
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return _no_schema("incidents", store)
        dry = recorded_findings(store, args.all, args.node)  # a dry run's findings: no txn, nothing acted
        code = _list(incidents(store, args.all, args.node) + dry, args.json, args.all)
        if not args.json:
            _list_rebaselines(Ledger(store), args.all, args.node)
        return code


def run_actions(args: argparse.Namespace) -> int:
    since = None
    if args.since:
        since = _since(args.since)
        if since is None:
            return usage(f"actions: --since {args.since!r}: neither ISO-8601, epoch seconds nor a duration")
    with Store(args.dsn, args.database) as store:
        if not initialised(store):
            return _no_schema("actions", store)
        ledger = Ledger(store)
        states = ledger.action_states([args.txn] if args.txn else None, args.status, since)
        # the rule each acts for (an incident's actions serve several); bookkeeping rows have none
        rule_of = {fid: known.rule_id for fid, known in ledger.known_findings().items()} if states else {}
        return _actions(states, args, rule_of)


def _on_one_incident(act: Callable[[Store, Incident, argparse.Namespace], int]) -> Command:
    """`incidents show|ack|unack|repaired TXN`: the incident TXN names, found, given to `act`."""

    @functools.wraps(act)
    def run(args: argparse.Namespace) -> int:
        name = f"incidents {args.incidents_command}"
        if args.all or args.node is not None:
            return usage(f"{name}: --node and --all only filter the list of incidents (`incidents`)")
        if not args.txn.strip():  # a dry run's findings have no txn: an empty id would take them all
            return usage(f"{name}: an empty transaction id (TXN of `incidents`)")
        with Store(args.dsn, args.database) as store:
            if not initialised(store):
                return _no_schema(name, store)
            found = incident(store, args.txn)
            rebaselines = (
                Ledger(store).action_states([args.txn], actions=[REBASELINE]) if found is None else []
            )
            if rebaselines and args.incidents_command == "show":
                return _show_rebaseline(rebaselines, args.json)
            if found is None:
                return usage(f"{name}: no incident {args.txn!r} (`stethoscope incidents --all` lists them)")
            return act(store, found, args)

    return run


def _txn_command(
    sub: Subcommands,
    parents: list[argparse.ArgumentParser],
    name: str,
    func: Callable[[argparse.Namespace], int],
    note: str | None,
    help: str,
) -> None:
    """A subcommand on one incident, named by its txn, said by a person (--by, and --note where given)."""
    parser = sub.add_parser(name, help=help, parents=parents)
    parser.set_defaults(func=func)
    parser.add_argument("txn", help="the incident's transaction id")
    if note is not None:
        parser.add_argument("--note", default="", help=note)
    parser.add_argument("--by", help="who (default: the user running the command)")


@_on_one_incident
def run_show(_store: Store, found: Incident, args: argparse.Namespace) -> int:
    return _show(found, args.json)


@_on_one_incident
def run_ack(store: Store, found: Incident, args: argparse.Namespace) -> int:
    by = args.by or user()
    acknowledge(store, found, by, args.note)
    tell(f"incident {found.txn_id} ({found.node_id} {found.device or '-'}) acknowledged by {by}")
    return EXIT_OK


@_on_one_incident
def run_unack(store: Store, found: Incident, args: argparse.Namespace) -> int:
    if found.ack is None:
        return usage(f"incidents unack: incident {found.txn_id} is not acknowledged")
    unacknowledge(store, found, args.by or user())
    tell(f"incident {found.txn_id} ({found.node_id} {found.device or '-'}) no longer acknowledged")
    return EXIT_OK


@_on_one_incident
def run_repaired(store: Store, found: Incident, args: argparse.Namespace) -> int:
    return _repaired(store, found, args.by or user(), args.note)


def _no_schema(name: str, store: Store) -> int:
    return usage(f"{name}: no schema in {redact(store.dsn)}: run `stethoscope db init` first")


def _repaired(store: Store, found: Incident, by: str, note: str) -> int:
    """A `repaired` row: the executor's next cycle runs verify for the incident (remediation.rebaseline)."""
    ledger = Ledger(store)
    if not any(d.txn_id == found.txn_id and d.node == found.node_id for d in ledger.drains()):
        return usage(
            f"incidents repaired: incident {found.txn_id} holds no drain of {found.node_id}: "
            "nothing for verify to resume"
        )
    row = repaired_row(found.txn_id, found.node_id, by, note)
    ledger.write_action(row, row["finished_at"])
    tell(
        f"incident {found.txn_id} ({found.node_id}) marked repaired by {by}: the executor's next cycle "
        f"verifies it (`stethoscope actions --txn {found.txn_id}` shows it)"
    )
    return EXIT_OK


def _show_rebaseline(states: list[ActionState], as_json: bool) -> int:
    """A re-baseline (its rb- txn, as `incidents` lists it): its row, as `actions --txn` shows it."""
    entries = [_action(s) for s in states]
    if as_json:
        print(json.dumps({"txn_id": states[0].txn_id, "actions": entries}, indent=1))
        return EXIT_OK
    for s, e in zip(states, entries, strict=True):
        why = s.detail.get("why", "")
        tell(f"re-baseline {e['txn_id']}: {e['target']} {e['status']}, {why}; since {e['started_at']}")
        tell(f"  {_line(e)}")
    return EXIT_OK


def _list_rebaselines(ledger: Ledger, every: bool, node: str | None) -> None:
    """The re-baselines not done (all of them with --all): waiting for their window, running."""
    shown = [
        s
        for s in ledger.action_states(actions=[REBASELINE])
        if (every or s.status not in FINISHED) and (node is None or s.target == node)
    ]
    if shown:
        print("re-baselines:")
    for s in shown:
        why, reason = s.detail.get("why", ""), s.detail.get("reason", "")
        tell(f"{s.txn_id:<20} {s.target:<14} {s.status:<8} {why}: {reason}")


def _since(text: str) -> int | None:
    try:
        return moment_ms(text, now_ms())
    except (ValueError, OverflowError):
        return None


def _list(found: list[Incident], as_json: bool, every: bool = False) -> int:
    if as_json:
        print(json.dumps([i.as_dict() for i in found], indent=1))
        return EXIT_OK
    if not found:
        print("no incidents recorded" if every else "no open incidents")
        return EXIT_OK
    rows = [["TXN", "NODE", "DEVICE", "SEVERITY", "STATUS", "FIRST SEEN / LAST SEEN", "RULES"]]
    rows += [
        [
            i.txn_id or "-",
            i.node_id,
            i.device or "-",
            i.severity,
            i.status,
            f"{iso(i.first_seen_ms)} / {iso(i.last_seen_ms)}",
            ", ".join(i.rules) + _acked(i),
        ]
        for i in found
    ]
    print("\n".join(aligned(rows)))
    return EXIT_OK


def _acked(found: Incident) -> str:
    ack = found.ack
    return f"  ({ack.describe()})" if ack else ""


def _action(state: ActionState, rule_of: dict[str, str] | None = None) -> dict[str, Any]:
    detail = state.detail
    entry = {
        "txn_id": state.txn_id,
        "finding_id": state.finding_id,
        "action": state.action,
        "target": state.target,
        "status": state.status,
        "attempt": attempt_of(detail) if "attempt" in detail else None,
        "of": detail.get("of"),
        "why": reason_of(detail),
        "started_at": iso(state.started_ms),
        "next_retry_at": detail.get("next_retry_at"),
        "history": detail.get("history", []),
    }
    if rule_of is not None:
        entry["rule_id"] = rule_of.get(state.finding_id, "")
    return entry


def _line(entry: dict[str, Any]) -> str:
    """action, status, the attempt (of a retried or failing action) and why."""
    parts = [f"{entry['action']:<30}", f"{entry['status']:<9}"]
    if entry["attempt"] and (entry["attempt"] > 1 or entry["status"] in RETRIED):
        parts.append(f"attempt {entry['attempt']} of {entry['of']}")
    if entry["next_retry_at"]:
        parts.append(f"next at {entry['next_retry_at']}")
    if entry["why"]:
        parts.append(entry["why"])
    return " ".join(parts).rstrip()


def _actions(states: list[ActionState], args: argparse.Namespace, rule_of: dict[str, str]) -> int:
    entries = [_action(s, rule_of) for s in states]
    if args.json:
        print(json.dumps(entries, indent=1))
        return EXIT_OK
    if not entries and args.txn:  # as `incidents show`: a transaction not on record is the user's error
        return usage(f"actions: no actions of transaction {args.txn!r} on record")
    if not entries:
        print("no actions recorded" + (" matching" if args.status or args.since else ""))
    rows = [[e["started_at"], e["txn_id"], e["target"], e["rule_id"] or "-", _line(e)] for e in entries]
    for line in aligned(rows):
        print(line)
    return EXIT_OK


def _show(found: Incident, as_json: bool) -> int:
    rule_of = {f.finding_id: f.rule_id for f in found.findings}
    entries = [_action(s, rule_of) for s in found.actions]
    if as_json:
        members = [
            {
                "finding_id": f.finding_id,
                "rule_id": f.rule_id,
                "device": f.device,
                "severity": f.severity,
                "status": f.status,
                "first_seen": iso(f.first_seen_ms),
                "last_seen": iso(f.last_seen_ms),
                "message": f.message,
            }
            for f in found.findings
        ]
        print(json.dumps({**found.as_dict(), "findings": members, "actions": entries}, indent=1))
        return EXIT_OK
    tell(
        f"incident {found.txn_id}: {found.node_id} {found.device or '-'}, {found.severity}, {found.status}; "
        f"first seen {iso(found.first_seen_ms)}, last seen {iso(found.last_seen_ms)}"
    )
    ack = found.ack
    if ack is not None:
        what = "its retries and alerts wait" if ack.pausing else "its retries and alerts go on"
        tell(f"{ack.describe()} at {iso(ack.at_ms)}{': ' + ack.note if ack.note else ''} ({what})")
    print("findings:")
    for f in found.findings:
        tell(f"  {f.severity:<9} {f.rule_id:<32} {f.device or '-':<10} {f.status:<9} {f.message}")
    print("actions:")
    for e in entries:
        for earlier in e["history"]:
            tell(
                f"  {earlier.get('at', ''):<29} {e['action']:<30} {earlier.get('status', ''):<9} "
                f"attempt {earlier.get('attempt')}  {earlier.get('why', '')}".rstrip()
            )
        tell(f"  {e['started_at']:<29} {_line(e)}  ({e['rule_id'] or found.node_id})")
    return EXIT_OK
