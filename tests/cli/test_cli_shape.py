"""One CLI shape: every command registers its parser with a `func` to run, the global options reach
every subcommand through argparse's `parents=`, and the helpers every command uses are written once."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from stethoscope.cli.main import build_parser

CLI = Path(__file__).resolve().parents[2] / "stethoscope" / "cli"
ARGPARSE_INTERNALS = {"_actions", "_option_string_actions", "_subparsers", "_group_actions"}
SHARED_HELPERS = {"_say", "_usage", "_user", "_print_json", "say", "usage", "user", "print_json"}
GLOBAL_OPTIONS = ("--dsn", "--database", "--spool-dir", "--debug")


def _children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of `parser` by name (the test may read argparse's internals; the CLI may not)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found.update(action.choices)
    return found


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(path, parser, has subcommands) of every command at any depth."""
    for name, child in _children(parser).items():
        below = _children(child)
        yield (*path, name), child, bool(below)
        yield from _commands(child, (*path, name))


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _sources() -> list[Path]:
    return sorted(CLI.glob("*.py"))


def test_every_leaf_command_says_what_runs_it():
    commands = list(_commands(build_parser()))
    assert len(commands) > 30
    without = [
        " ".join(path) for path, parser, below in commands if not below and parser.get_default("func") is None
    ]
    assert without == []
    # a group whose subcommand is optional (`incidents [show|ack|unack]`) runs something by itself too
    optional_groups = [
        " ".join(path)
        for path, parser, below in commands
        if below and not _required_subcommand(parser) and parser.get_default("func") is None
    ]
    assert optional_groups == []


def _required_subcommand(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) and a.required for a in parser._actions)


def test_every_command_at_any_depth_takes_the_global_options():
    missing = [
        (" ".join(path), option)
        for path, parser, _ in _commands(build_parser())
        for option in GLOBAL_OPTIONS
        if option not in _options(parser)
    ]
    assert missing == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--dsn", "chdb://x", "--spool-dir", "s", "diagnose"],
        ["diagnose", "--dsn", "chdb://x", "--spool-dir", "s"],
        ["db", "--dsn", "chdb://x", "init", "--spool-dir", "s"],
        ["--dsn", "chdb://x", "incidents", "show", "T", "--spool-dir", "s"],
    ],
)
def test_global_options_before_or_after_the_subcommand(argv):
    args = build_parser().parse_args(argv)
    assert (args.dsn, str(args.spool_dir), args.database, args.debug) == ("chdb://x", "s", None, False)
    assert callable(args.func)


def test_no_value_after_the_subcommand_overwrites_one_before_it():
    args = build_parser().parse_args(["--dsn", "chdb://before", "--debug", "spool", "status"])
    assert args.dsn == "chdb://before" and args.debug is True


def test_no_cli_module_reaches_into_argparse_internals():
    touched = [
        f"{path.name}:{node.lineno} .{node.attr}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ARGPARSE_INTERNALS | {"_SubParsersAction"}
    ]
    assert touched == []


def test_the_shared_helpers_are_defined_once_in_common():
    defined = [
        f"{path.name}:{node.lineno} {node.name}"
        for path in _sources()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and node.name in SHARED_HELPERS
    ]
    assert defined and all(entry.startswith("common.py:") for entry in defined), defined


def test_every_inventory_option_says_the_environment_variable_it_falls_back_to():
    # every command reads --inventory through one function that falls back to $STETHOSCOPE_INVENTORY
    helps = {
        " ".join(path): action.help or ""
        for path, parser, _ in _commands(build_parser())
        for action in parser._actions
        if "--inventory" in action.option_strings
    }
    assert len(helps) > 10
    assert {path: h for path, h in helps.items() if "$STETHOSCOPE_INVENTORY" not in h} == {}
    assert not [h for h in helps.values() if "inventories/lab" in h]
