"""What every command module shares: the global options (given to each subcommand through argparse's
`parents=`), the options several commands take, what they read them into (inventory, catalog, rules,
model, spool folder) and the lines a command says."""

from __future__ import annotations

import argparse
import contextlib
import functools
import getpass
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from stethoscope.catalog import Catalog, CatalogError
from stethoscope.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from stethoscope.diagnosis.model_findings import ModelUse, level_of
from stethoscope.diagnosis.rules import LoadResult, load_rules
from stethoscope.diagnosis.unknown import Fleet
from stethoscope.inventory import NO_INVENTORY, Inventory, load_inventory
from stethoscope.paths import default_spool_dir, rules_dir
from stethoscope.store.dsn import ConfigError, redact
from stethoscope.terminal import terminal_safe

Command = Callable[[argparse.Namespace], int]

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
    group.add_argument(
        "--database", default=default, help="database name (default $STETHOSCOPE_DATABASE, else stethoscope)"
    )
    group.add_argument(
        "--spool-dir",
        type=Path,
        default=default,
        help="spool folder (default $STETHOSCOPE_SPOOL_DIR, else the state folder's spool/)",
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


def model_options(
    parser: argparse.ArgumentParser, no_model_help: str = "rules only: without the learned model's findings"
) -> None:
    parser.add_argument(
        "--model",
        type=Path,
        metavar="JSON",
        help="the learned model's metadata, its graphs beside it (default core12.json: the state "
        "folder's models/ where `model finetune` wrote it, else the shipped rules/models/)",
    )
    parser.add_argument("--no-model", action="store_true", help=no_model_help)


def execution_options(parser: argparse.ArgumentParser) -> None:
    """--execute, -e and --inventory (serve has an --inventory of its own: execute_options)."""
    execute_options(parser)
    parser.add_argument(
        "--inventory",
        type=Path,
        help="inventory of the nodes (or $STETHOSCOPE_INVENTORY; a dry run without one: every stored node)",
    )


def execute_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--execute", action="store_true", help="carry out the actions (default: dry-run)")
    parser.add_argument(
        "-e",
        "--extra-var",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting or template variable, over the inventory's (repeatable)",
    )


def inventory_named(args: argparse.Namespace) -> Path | None:
    """--inventory, else $STETHOSCOPE_INVENTORY, else None: the one place a command looks it up."""
    named = args.inventory or os.environ.get("STETHOSCOPE_INVENTORY")
    return Path(named) if named else None


def inventory_of(args: argparse.Namespace, required: bool = False, command: str = "") -> Inventory | None:
    """The inventory named by --inventory or $STETHOSCOPE_INVENTORY; None for a dry-run given none.
    Acting (--execute) or `required` without one is a usage error (exit 2): no command acts on the
    lab's nodes unless it is told to. Errors are ConfigErrors (exit 2)."""
    named = inventory_named(args)
    if named is None:
        if required or getattr(args, "execute", False):
            what = "--execute" if getattr(args, "execute", False) else "this command"
            raise ConfigError(f"{command or args.command}: {what} {NO_INVENTORY}")
        return None
    try:
        return load_inventory(named)
    except Exception as exc:  # InventoryError, and ansible's own parse errors, which have many types
        raise ConfigError(f"inventory: {exc}") from None


def catalog_for(inventory: Inventory | None) -> Catalog:
    """The catalog, with the inventory's report intervals where it sets them."""
    catalog = Catalog.load()
    if inventory is None:
        return catalog
    period = inventory.settings.get("push_agent_period")
    if isinstance(period, float | str) and not isinstance(period, bool):  # YAML: 5, 5.0 or "5"
        with contextlib.suppress(ValueError):
            period = math.ceil(float(period))
    try:
        return catalog.with_intervals(
            inventory.settings.get("stethoscope_sweep_interval"),
            inventory.settings.get("stethoscope_metric_intervals") or {},
            period,
        )
    except CatalogError as exc:
        say(f"inventory {inventory.path}: {exc}")
        raise SystemExit(EXIT_USAGE) from None


def fleet_of(inventory: Inventory | None) -> Fleet | None:
    """The hosts UNKNOWN answers for: those of the inventory named, if any."""
    return Fleet.of(inventory) if inventory is not None else None


def hosts_of(inventory: Inventory | None) -> list[str] | None:
    """The only nodes a command given `inventory` evaluates and acts on (None: every stored node)."""
    return None if inventory is None else sorted(inventory.hosts)


def model_of(args: argparse.Namespace, inventory: Inventory | None, command: str) -> ModelUse | None:
    """The learned model a command runs beside the rules: None under --no-model. Its files missing
    or damaged is a configuration error (exit 2) naming the file: a diagnosis must not pass as
    healthy because the model never ran."""
    path = model_path_of(args)
    if path is None:
        return None
    from stethoscope.model.inference import graphs_for
    from stethoscope.model.metadata import ModelError, load

    try:
        level = level_of(inventory.settings.get("stethoscope_model_level") if inventory else None)
    except ValueError as exc:
        say(f"{command}: inventory {inventory.path if inventory else ''}: {exc}")
        raise SystemExit(EXIT_USAGE) from None
    try:
        meta = load(Path(path))
        graphs_for(meta)  # a graph onnxruntime cannot load fails here, not in the first cycle
    except ModelError as exc:
        say(f"{command}: {exc}; --no-model diagnoses by the rules alone")
        raise SystemExit(EXIT_USAGE) from None
    return ModelUse(meta, level)


def model_path_of(args: argparse.Namespace) -> Path | None:
    """The learned model's metadata a command reads: --model, else the default; None under --no-model."""
    if getattr(args, "no_model", False):
        return None
    from stethoscope.model.metadata import metadata_path

    return Path(getattr(args, "model", None) or metadata_path())


def checked_rules(path: Path | None, catalog: Catalog, command: str) -> LoadResult:
    """The rules under `path` (default rules/); a missing path, a rule that does not load, or no rule
    at all exits 2: a gate must not pass because its rules were never evaluated."""
    path = Path(path or rules_dir())
    if not path.exists():
        say(f"{command}: {path}: no such file or folder")
        raise SystemExit(EXIT_USAGE)
    loaded = load_rules(path, catalog)
    for error in loaded.errors:
        say(f"{command}: {error}")
    if loaded.errors:
        say(f"{command}: {len(loaded.errors)} problems in the rules under {path}; nothing evaluated")
        raise SystemExit(EXIT_USAGE)
    if not loaded.rules:
        say(f"{command}: no rules under {path} ({loaded.files} rule files)")
        raise SystemExit(EXIT_USAGE)
    return loaded


def spool_dir_of(args: argparse.Namespace) -> Path:
    """--spool-dir, else $STETHOSCOPE_SPOOL_DIR, else the state folder's spool/."""
    return args.spool_dir or default_spool_dir()


def say(message: str) -> None:
    """`stethoscope: MESSAGE` on standard error: what went wrong, or what the user should know."""
    print(f"stethoscope: {message}", file=sys.stderr)


def usage(message: str) -> int:
    """Says a usage or configuration error; its exit status."""
    say(message)
    return EXIT_USAGE


def said_as(
    name: str, usage_errors: tuple[type[Exception], ...], failures: tuple[type[Exception], ...] = ()
) -> Callable[[Command], Command]:
    """A command's `func` that says its errors as `stethoscope: NAME: what`: one of `usage_errors` is
    exit 2, one of `failures` exit 1 (the rest reach main)."""

    def wrap(command: Command) -> Command:
        @functools.wraps(command)
        def run(args: argparse.Namespace) -> int:
            try:
                return command(args)
            except usage_errors as exc:
                say(f"{name}: {redact(str(exc))}")
                return EXIT_USAGE
            except failures as exc:
                say(f"{name}: {redact(str(exc))}")
                return EXIT_FAILED

        return run

    return wrap


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
