"""The collection's unit tests, as `ansible-test units` runs them: the parser tests of the project's
suite (tests/plugins/module_utils/test_parse_*.py and the capture tests, linked beside this file) on
the same real captures,
read from the tests/fixtures of the checkout, or of the folder that tools/ansible_sanity.sh assembles
the collection in (beside its ansible_collections/, where ansible-test's sanity checks do not look:
sysfs captures have names like 0000:00:06.0)."""

from __future__ import annotations

import sys
from pathlib import Path


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


# The linked tests import `conftest` as the project's suite runs them (tests/ on sys.path); ansible-test
# imports this file as ansible_collections.aicluster.stethoscope.tests.unit...conftest instead.
sys.modules.setdefault("conftest", sys.modules[__name__])
