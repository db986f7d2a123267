"""`stethoscope breaker [--json]` (docs/design.md "Remediation safety"): the circuit breaker's limits,
what counts against each now, and the drains it refused lately and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stethoscope.cli.common import Subcommands, inventory_of, usage
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.diagnosis.rules import parse_duration
from stethoscope.remediation.breaker_state import breaker_state
from stethoscope.store.client import Store
from stethoscope.terminal import terminal_safe_data
from stethoscope.timeutil import now_ms


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "breaker",
        help="the circuit breaker: its limits, what counts against them, what it refused",
        parents=parents,
    )
    parser.add_argument(
        "--inventory",
        type=Path,
        help="the inventory the executor acts on (or $STETHOSCOPE_INVENTORY; required)",
    )
    parser.add_argument(
        "-e",
        "--extra-var",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting, over the inventory's (repeatable)",
    )
    parser.add_argument("--since", default="24h", help="refusals within this duration (default 24h)")
    parser.add_argument("--json", action="store_true", help="print the state as JSON")
    parser.set_defaults(func=breaker_command)


def breaker_command(args: argparse.Namespace) -> int:
    from stethoscope.cli.diagnose import execution_context

    seconds = parse_duration(args.since)
    if seconds is None:
        return usage(f"breaker: --since {args.since!r}: not a duration such as 24h")
    inventory = inventory_of(args, required=True, command="breaker")
    assert inventory is not None  # inventory_of exits 2 without one
    context = execution_context(args, inventory)
    with Store(args.dsn, args.database) as store:
        state = breaker_state(store, context(store.dsn, store.database), now_ms() - seconds * 1000)
    print(json.dumps(state, indent=1, sort_keys=True) if args.json else render(state, args.since))
    return EXIT_OK


def render(state: dict[str, Any], since: str) -> str:
    state = terminal_safe_data(state)  # Slurm's reasons are anyone's text
    limits = state["limits"]
    own, out, window = limits["own"], limits["out_of_service"], limits["window"]
    lines = [
        f"circuit breaker of {state['fleet_size']} nodes (Slurm: {state['slurm']})",
        f"  own isolations     {own['count']} of {own['limit']}  [{own['rule']}]  {_nodes(own['nodes'])}",
        f"  out of service     {out['count']} of {out['limit']}  [{out['rule']}]  {_nodes(out['nodes'])}",
        f"  isolated in window {window['count']} of {window['limit']}  [{window['rule']}]  "
        + _nodes(window["nodes"]),
    ]
    for node, reason in out["others"].items():
        lines.append(f"    {node}: out of service in Slurm, not by stethoscope ({reason or 'no reason'})")
    refusals = state["refusals"]
    lines.append(f"refused within {since}: {len(refusals) or 'none'}")
    lines += [f"  {r['at']} {r['node']} {r['action']} txn {r['txn_id']}: {r['reason']}" for r in refusals]
    return "\n".join(lines)


def _nodes(nodes: list[str]) -> str:
    return ", ".join(nodes) if nodes else "-"
