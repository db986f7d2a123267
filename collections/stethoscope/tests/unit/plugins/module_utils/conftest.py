"""The collection's unit tests, as `ansible-test units` runs them: the module_utils tests of the
project's suite (tests/plugins/module_utils/, linked beside this file, all but those that import the
controller package) on the same real captures, read from the tests/fixtures of the checkout, or of
the folder that tools/ansible_sanity.sh assembles the collection in (beside its ansible_collections/,
where ansible-test's sanity checks do not look: sysfs captures have names like 0000:00:06.0). The
property tests draw the same examples every run, as in the suite (requirements.txt: hypothesis)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import settings

settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))


def _fixtures_folder() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "tests" / "fixtures" / "public").is_dir():
            return folder / "tests" / "fixtures"
    raise FileNotFoundError("no tests/fixtures/public in any folder above %s" % __file__)


FIXTURES = _fixtures_folder()
PUBLIC = FIXTURES / "public"
REAL = FIXTURES / "real" / "h200-vm"


def fixture_text(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8", errors="replace")


def fake_tools(bindir: Path, log: Path, tools: dict) -> None:
    """The suite's stand-in commands (tests/conftest.py): name -> {"args": fixture path, or shell
    code} (or one of them for any args); each call's argv is appended to `log`."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, cases in tools.items():
        if isinstance(cases, str):
            cases = {"*": cases}
        lines = ["#!/bin/sh", 'echo "%s${*:+ $*}" >> "%s"' % (name, log), 'case "$*" in']
        for args, output in cases.items():
            source = FIXTURES / output
            body = 'cat "%s"' % source if source.is_file() else output
            pattern = "*" if args == "*" else '"%s"' % args
            lines.append("  %s) %s;;" % (pattern, body))
        lines += ["esac", ""]
        (bindir / name).write_text("\n".join(lines))
        (bindir / name).chmod(0o755)


# The linked tests import `conftest` as the project's suite runs them (tests/ on sys.path); ansible-test
# imports this file as ansible_collections.aicluster.stethoscope.tests.unit...conftest instead.
sys.modules.setdefault("conftest", sys.modules[__name__])
