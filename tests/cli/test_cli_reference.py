"""docs/cli.md is the CLI's own help: exactly what tools/cli_reference.py renders from the parser the
`stethoscope` command runs, so a changed option or help text that is not regenerated fails here."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from cli_reference import PAGE, build_parser, commands, python_version, recorded_python, render

TOP_LEVEL = ("db", "ingest", "summary", "baseline", "diagnose", "serve", "rules", "model", "incidents")


def _projects_python() -> str:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    return pyproject["tool"]["mypy"]["python_version"]


def test_docs_cli_md_is_rendered_under_the_projects_python():
    """A page regenerated under another Python would switch the comparison below off in CI: refused."""
    assert recorded_python(PAGE.read_text(encoding="utf-8")) == _projects_python(), (
        f"docs/cli.md must be rendered under Python {_projects_python()} (pyproject [tool.mypy])"
    )


def test_docs_cli_md_is_what_the_tool_generates():
    text = PAGE.read_text(encoding="utf-8")
    recorded = recorded_python(text)
    if recorded != python_version():
        pytest.skip(
            f"docs/cli.md was rendered under Python {recorded}; argparse lays out help differently "
            f"under {python_version()}, so only that version can compare it"
        )
    assert text == render(), "docs/cli.md is stale: run python tools/cli_reference.py"


def test_the_reference_holds_every_command_and_subcommand():
    text = render()
    progs = [parser.prog for parser in commands(build_parser())]
    assert len(progs) == len(set(progs)) and len(progs) >= 40
    assert {f"stethoscope {name}" for name in TOP_LEVEL} | {"stethoscope rules sql"} <= set(progs)
    assert all(f"\n## {prog}\n" in text for prog in progs)


@pytest.mark.parametrize("columns", [None, "37"])
def test_rendering_leaves_the_terminal_width_as_it_was(monkeypatch, columns):
    # the page renders at a fixed width; the tests run after it in this process see the caller's
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    render()
    assert os.environ.get("COLUMNS") == columns
