"""The `stethoscope` command. Exit codes: 0 healthy, 1 findings, 2 usage or config error, 3 the run
itself failed (a crash is never reported as findings)."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from stethoscope.catalog import CatalogError
from stethoscope.cli import (
    audit,
    baseline,
    breaker,
    db,
    diagnose,
    fault,
    gate,
    incidents,
    ingest,
    model,
    outcomes,
    report,
    rules,
    serve,
    silence,
    spool,
    summary,
    verify,
)
from stethoscope.cli.common import add_global_options, say, shared_options
from stethoscope.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from stethoscope.cli.version import PrintVersions
from stethoscope.diagnosis.engine import readers_wanted
from stethoscope.store.client import SchemaMissing, StoreError
from stethoscope.store.dsn import ConfigError, redact

PACKAGE = Path(__file__).resolve().parent.parent

# one module per command group, each adding its parsers with `func` to run; in `--help`'s order
GROUPS = (
    db,
    ingest,
    summary,
    baseline,
    diagnose,  # diagnose, watch
    verify,
    rules,
    spool,
    serve,  # agent, collector, serve
    report,  # top, report
    model,
    fault,
    audit,
    breaker,
    incidents,  # incidents, actions
    silence,
    outcomes,
    gate,
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: the global options on the top parser and, through `parents=`, on every
    subcommand at any depth, so that they may come before or after its name."""
    parser = argparse.ArgumentParser(prog="stethoscope", description=__doc__)
    parser.add_argument("--version", action=PrintVersions)
    add_global_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True)
    parents = [shared_options()]
    for group in GROUPS:
        group.register(commands, parents)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        readers_wanted()  # STETHOSCOPE_READERS checked first: a bad value is exit 2, not a failed cycle
        return _run(args)
    except (ConfigError, CatalogError) as exc:
        say(redact(exc))
        return EXIT_USAGE
    except SchemaMissing as exc:  # before StoreError, its base: a missing schema is the user's to create
        say(redact(exc))
        return EXIT_USAGE
    except StoreError as exc:
        say(redact(exc))
        return EXIT_FAILED
    except BrokenPipeError:  # `stethoscope baseline | head`
        sys.stderr.close()
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_FAILED
    except Exception as exc:  # a crash is a failed run (3), never "findings" (1); one line unless --debug
        if args.debug or os.environ.get("STETHOSCOPE_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if Path(f.filename).resolve().is_relative_to(PACKAGE)]
        where = (ours or frames)[-1]
        say(
            f"internal error: {type(exc).__name__}: {redact(str(exc))} "
            f"(at {Path(where.filename).name}:{where.lineno}; "
            "--debug or STETHOSCOPE_DEBUG=1 for the traceback)"
        )
        return EXIT_FAILED


def _run(args: argparse.Namespace) -> int:
    """The command the parsed line names (its parser's `func`)."""
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
