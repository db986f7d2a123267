"""`stethoscope fault confirm|add|list` (docs/design.md "Storage"): the faults of the past, which
`stethoscope audit` (cli/audit.py) measures the diagnosis against."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from stethoscope.catalog import LAYERS, Catalog
from stethoscope.cli.common import Subcommands, checked_rules, usage
from stethoscope.cli.exit_codes import EXIT_OK, EXIT_USAGE
from stethoscope.diagnosis.layers import rule_layer
from stethoscope.store.client import Store
from stethoscope.store.fault_file import impact_of
from stethoscope.store.faults import (
    Fault,
    known_nodes,
    latest_sample_ms,
    list_faults,
    record,
    stored_finding,
)
from stethoscope.terminal import terminal_safe
from stethoscope.timeutil import iso

IMPACT_HELP = "impact time: ISO-8601, epoch seconds, or latest[-DURATION] (the newest stored sample)"


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    fault = commands.add_parser(
        "fault", help="the faults of the past: the audit's ground truth", parents=parents
    )
    sub = fault.add_subparsers(dest="fault_command", required=True)
    confirm = sub.add_parser("confirm", help="record the fault a stored finding warned of", parents=parents)
    confirm.set_defaults(func=fault_confirm)
    confirm.add_argument("finding_id", help="a finding_id as `diagnose --json` prints it")
    confirm.add_argument("--impact", required=True, help=IMPACT_HELP)
    confirm.add_argument("--kind", help="fault kind (default: the finding's rule id)")
    confirm.add_argument("--layer", choices=LAYERS, help="layer (default: its rule's catalog layer)")
    confirm.add_argument("--note", default="", help="free text")
    confirm.add_argument("--rules", type=Path, help="rule file or folder (default rules/)")
    add = sub.add_parser("add", help="record a fault no finding warned of", parents=parents)
    add.set_defaults(func=fault_add)
    add.add_argument("--node", required=True)
    add.add_argument("--kind", required=True, help="e.g. ssd_wear, aer_storm, nvlink_crc")
    add.add_argument("--layer", required=True, help=f"one of {', '.join(LAYERS)}")
    add.add_argument("--impact", required=True, help=IMPACT_HELP)
    add.add_argument("--device", default="", help="e.g. gpu3, nvme0n1 (default: the node)")
    add.add_argument("--note", default="")
    listing = sub.add_parser("list", help="the recorded faults", parents=parents)
    listing.set_defaults(func=fault_list)
    listing.add_argument("--json", action="store_true", help="print them as JSON")


def _impact(store: Store, text: str, command: str) -> int | None:
    try:
        return impact_of(text, latest_sample_ms(store))
    except ValueError as exc:
        usage(f"fault {command}: --impact: {exc}")
        return None


def _store_fault(store: Store, fault: Fault) -> int:
    copied = record(store, fault)
    said = (
        f"recorded fault {fault.fault_id}: {fault.node_id} {fault.device or '-'} {fault.kind} "
        f"({fault.layer}) impact {iso(fault.impact_ms)}; {copied} raw rows kept in fault_windows"
    )
    print(terminal_safe(said))
    return EXIT_OK


def fault_add(args: argparse.Namespace) -> int:
    if args.layer not in LAYERS:
        return usage(f"fault add: --layer {args.layer!r}: one of {', '.join(LAYERS)}")
    with Store(args.dsn, args.database) as store:
        store.ensure_schema()
        if args.node not in known_nodes(store):
            return usage(f"fault add: unknown node {args.node!r} (not in the nodes table or the metrics)")
        impact = _impact(store, args.impact, "add")
        if impact is None:
            return EXIT_USAGE
        fault = Fault(args.node, args.kind, args.layer, impact, args.device, "added", args.note)
        return _store_fault(store, fault)


def _rule_layer(rule_id: str, rules_path: Path | None) -> str | None:
    from stethoscope.diagnosis.audit import MODEL_LAYERS

    if rule_id in MODEL_LAYERS:
        return MODEL_LAYERS[rule_id][0]
    catalog = Catalog.load()
    for rule in checked_rules(rules_path, catalog, "fault confirm").rules:
        if rule.rule_id == rule_id:
            return rule_layer(rule, catalog)
    return None


def fault_confirm(args: argparse.Namespace) -> int:
    with Store(args.dsn, args.database) as store:
        store.ensure_schema()
        stored = stored_finding(store, args.finding_id)
        if stored is None:
            return usage(f"fault confirm: no stored finding {args.finding_id!r} (`diagnose --json` lists)")
        rule_id, node, device = stored
        layer = args.layer or _rule_layer(rule_id, args.rules)
        if layer is None:
            return usage(f"fault confirm: rule {rule_id!r} is not among the rules; give --layer")
        impact = _impact(store, args.impact, "confirm")
        if impact is None:
            return EXIT_USAGE
        fault = Fault(node, args.kind or rule_id, layer, impact, device, "confirmed", args.note)
        return _store_fault(store, fault)


def fault_list(args: argparse.Namespace) -> int:
    with Store(args.dsn, args.database) as store:
        store.ensure_schema()
        faults = list_faults(store)
    if args.json:
        print(json.dumps([f.as_dict() for f in faults], indent=2))
        return EXIT_OK
    if not faults:
        print("no faults recorded")
    for f in faults:
        line = (
            f"{f.fault_id}  {f.as_dict()['impact_at']}  {f.node_id:<12} {f.device or '-':<12} "
            f"{f.kind:<20} {f.layer:<14} {f.source:<9} {f.note}"
        )
        print(terminal_safe(line))
    return EXIT_OK
