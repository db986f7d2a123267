"""One CLI shape: every command registers its parser with a `func` to run, the global options reach
every subcommand through argparse's `parents=`, and the helpers every command uses are written once."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
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


def test_each_command_runs_a_function_of_its_own_not_an_if_chain_on_its_name():
    """Two commands of one group (or a group and its subcommand) sharing a `func` means that function
    dispatches on the command's name again: argparse already chose."""
    commands = list(_commands(build_parser()))
    runs: dict[tuple[str, ...], list[str]] = {}
    shared = []
    for path, parser, _ in commands:
        func = parser.get_default("func")
        if func is None:
            continue
        name = f"{func.__module__}.{func.__qualname__}"
        for other_path, other in runs.items():
            if name in other and other_path[:-1] in (path[:-1], path[:-2]):
                shared.append((" ".join(other_path), " ".join(path), name))
        runs[path] = [name]
    assert shared == []


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


@pytest.mark.parametrize("argv", [["incidents", "--json", "show", "T"], ["incidents", "show", "T", "--json"]])
def test_incidents_json_before_or_after_show_is_kept(argv):
    assert build_parser().parse_args(argv).json is True
    assert build_parser().parse_args(["incidents", "show", "T"]).json is False


@pytest.mark.parametrize(
    "argv",
    [
        ["incidents", "--node", "n1", "ack", "T"],
        ["incidents", "--all", "unack", "T"],
        ["incidents", "--node", "n1", "repaired", "T"],
    ],
)
def test_incidents_list_options_given_to_a_subcommand_are_refused_not_ignored(argv, tmp_path, capsys):
    from stethoscope.cli.main import main

    assert main([*argv, "--dsn", f"chdb://{tmp_path / 'db'}"]) == 2
    said = capsys.readouterr().err
    assert "--node and --all" in said and argv[-2] in said
    assert not (tmp_path / "db").exists()


def _helps(option: str) -> dict[str, str]:
    return {
        " ".join(path): action.help or ""
        for path, parser, _ in _commands(build_parser())
        for action in parser._actions
        if option in action.option_strings
    }


@pytest.mark.parametrize(
    ("option", "says"),
    [
        ("--database", ("$STETHOSCOPE_DATABASE", "stethoscope")),
        ("--spool-dir", ("$STETHOSCOPE_SPOOL_DIR", "state folder")),
        ("--secret-file", ("telemetry/cluster.secret", "state folder")),
        ("--extra-var", ("over the inventory's",)),
    ],
)
def test_an_options_help_says_its_real_default(option, says):
    helps = _helps(option)
    assert helps
    assert {path: h for path, h in helps.items() if not all(s in h for s in says)} == {}
    assert not [h for h in helps.values() if "default .stethoscope" in h]


def test_rules_sql_says_where_a_rules_id_is_listed():
    sql = _children(_children(build_parser())["rules"])["sql"]
    rule_id = next(a for a in sql._actions if a.dest == "rule_id")
    assert "rules check lists the files" not in (rule_id.help or "")


def test_starting_the_cli_loads_neither_numpy_nor_jinja2():
    """A read typed beside serve starts a new process each time: the model's numpy and the rules'
    Jinja2 are loaded by the commands that use them, not by every command's start."""
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, stethoscope.cli.main; print(sorted({m.split('.')[0] for m in sys.modules}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "stethoscope" in loaded
    assert "'numpy'" not in loaded and "'jinja2'" not in loaded and "'onnxruntime'" not in loaded
