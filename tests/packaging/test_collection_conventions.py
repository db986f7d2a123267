"""What the ecosystem's validators expect of the collection's layout (tools/ansible_sanity.sh runs them):
Galaxy's importer indexes only the playbooks at the top of playbooks/; `ansible-test units` runs the
parser tests from the collection's tests/unit/; `ansible-test sanity` passes with no ignore but the
licence check (Apache-2.0, not the GPLv3 header validate-modules looks for)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import TOP

PLAYBOOKS = TOP / "playbooks"
COLLECTION_TESTS = TOP / "collections/stethoscope/tests"
UNIT = COLLECTION_TESTS / "unit/plugins/module_utils"
PARSER_TESTS = TOP / "tests/plugins/module_utils"  # the same path under tests/ as ansible-test's
NESTED = sorted(p for p in PLAYBOOKS.glob("*/*.yml") if p.parent.name != "templates")


def test_there_are_nested_playbooks_to_check():
    nested = {p.relative_to(PLAYBOOKS).as_posix() for p in NESTED}
    assert nested >= {"remediate/drain.yml", "remediate/verify.yml"}


@pytest.mark.parametrize("nested", NESTED, ids=lambda p: p.relative_to(PLAYBOOKS).as_posix())
def test_every_nested_playbook_has_a_top_level_entry_point_that_imports_it(nested: Path):
    relative = nested.relative_to(PLAYBOOKS).as_posix()
    entry = PLAYBOOKS / relative.replace("/", "_")
    assert entry.is_file(), f"{relative} has no entry point {entry.name}: Galaxy would not index it"
    (play,) = yaml.safe_load(entry.read_text(encoding="utf-8"))
    assert play["ansible.builtin.import_playbook"] == relative and play["name"]


def test_the_collections_unit_tests_link_every_parser_test_of_the_suite():
    linked = {p.name: p for p in UNIT.glob("test_*.py")}
    assert {p.name for p in PARSER_TESTS.glob("test_parse_*.py")} <= set(linked)
    for name, link in linked.items():
        assert link.is_symlink() and link.resolve() == (PARSER_TESTS / name).resolve(), name


def test_sanity_ignores_only_the_licence_check_of_files_that_exist():
    ignores = sorted(COLLECTION_TESTS.glob("sanity/ignore-*.txt"))
    assert ignores
    for ignore in ignores:
        for line in ignore.read_text(encoding="utf-8").splitlines():
            path, check = line.split("#", 1)[0].split()
            assert check == "validate-modules:missing-gplv3-license", line
            assert (TOP / path).is_file(), line
