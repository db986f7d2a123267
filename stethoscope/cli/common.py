"""What every command module shares: the global options (given to each subcommand through argparse's
`parents=`), the options several commands take, and the lines a command says."""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from pathlib import Path
from typing import Any, Protocol

from stethoscope.cli.exit_codes import EXIT_OK, EXIT_USAGE
from stethoscope.terminal import terminal_safe

FRESH_HELP = "evaluate now, even beside a serve that published this evaluation in its last cycle"
GLOBAL_OPTIONS = "global options"


class Subcommands(Protocol):
    """What `ArgumentParser.add_subparsers()` returns, as far as a command module uses it."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--dsn, --database, --spool-dir, --debug: on the top parser (default None) and, through
    `shared_options()`, on every subcommand (default SUPPRESS: a value given before the subcommand
    is not overwritten)."""
    group = parser.add_argument_group(GLOBAL_OPTIONS)
    group.add_argument(
        "--dsn", default=default, help="clickhouse-connect DSN (default $STETHOSCOPE_DSN, else embedded)"
    )
    group.add_argument("--database", default=default, help="database name (default stethoscope)")
    group.add_argument(
        "--spool-dir", type=Path, default=default, help="spool folder (default .stethoscope/spool)"
    )
    group.add_argument(
        "--debug",
        action="store_true",
        default=default if default is argparse.SUPPRESS else False,
        help="print the traceback of an internal error (or STETHOSCOPE_DEBUG=1)",
    )


def shared_options() -> argparse.ArgumentParser:
    """The parent parser every subcommand, at any depth, is built with (`parents=[...]`)."""
    parent = argparse.ArgumentParser(add_help=False)
    add_global_options(parent, argparse.SUPPRESS)
    return parent


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


def execution_options(parser: argparse.ArgumentParser) -> None:
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


def say(message: str) -> None:
    """`stethoscope: MESSAGE` on standard error: what went wrong, or what the user should know."""
    print(f"stethoscope: {message}", file=sys.stderr)


def usage(message: str) -> int:
    """Says a usage or configuration error; its exit status."""
    say(message)
    return EXIT_USAGE


def tell(line: str) -> None:
    """A line on standard output with the nodes' text in it (names, devices, messages, reasons) made
    terminal-safe."""
    print(terminal_safe(line))


def print_json(document: object) -> int:
    """One JSON document on standard output, the --json of every command that reports."""
    print(json.dumps(document, indent=1, sort_keys=True, default=str))
    return EXIT_OK


def user() -> str:
    """Who runs the command, for the records that name a person (silences, acknowledgements)."""
    try:
        return getpass.getuser()
    except Exception:  # no login name in this environment (a container without a passwd entry)
        return "unknown"
