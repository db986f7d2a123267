"""What the ecosystem's validators expect of the collection's layout (tools/ansible_sanity.sh runs them):
Galaxy's importer indexes only the playbooks at the top of playbooks/, and indexes every one of them;
`ansible-test units` runs the suite's module_utils tests from the collection's tests/unit/ (all but
those needing the controller package); `ansible-test sanity` passes with no ignore but the licence
check (Apache-2.0, not the GPLv3 header validate-modules looks for)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import TOP

PLAYBOOKS = TOP / "playbooks"
COLLECTION_TESTS = TOP / "collections/stethoscope/tests"
UNIT = COLLECTION_TESTS / "unit/plugins/module_utils"
PARSER_TESTS = TOP / "tests/plugins/module_utils"  # the same path under tests/ as ansible-test's
NESTED = sorted(p for p in PLAYBOOKS.glob("*/*.yml") if p.parent.name != "templates")
CHECK_INDEXED = TOP / "tools/importer_playbooks.py"


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


# The suite's module_utils tests that `ansible-test units` cannot run: they import the controller
# package (`stethoscope`), which the collection does not hold.
CONTROLLER_BOUND = {
    "test_broken_instruments.py": "the store (stethoscope.store) and tests/e2e's XID sweep",
    "test_kernel_log_captures.py": "the rules engine and catalog, and tests/e2e's XID sweep",
    "test_smart_captures.py": "the catalog and device names, and the suite's run_module (ansible's CLI)",
}


def importer_result(tmp_path: Path, playbooks: list[str]) -> Path:
    """An importer_result.json as galaxy-importer writes it: its contents name each playbook it
    indexed by file name (only those at the top of playbooks/), beside the roles and modules."""
    contents = [{"name": name, "content_type": "playbook", "description": None} for name in playbooks]
    contents.append({"name": "gpu_facts", "content_type": "module", "description": "GPU facts"})
    path = tmp_path / "importer_result.json"
    path.write_text(json.dumps({"metadata": {}, "contents": contents}), encoding="utf-8")
    return path


def check_indexed(result: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CHECK_INDEXED), str(result), str(PLAYBOOKS)], capture_output=True, text=True
    )


def test_the_lint_step_fails_when_galaxy_importer_leaves_a_playbook_out(tmp_path: Path):
    """tools/ansible_sanity.sh checks galaxy-importer's result: every playbook under playbooks/, the
    nested ones through their entry points, indexed; one left out fails `make lint` naming it."""
    top_level = sorted(p.name for p in PLAYBOOKS.glob("*.yml"))
    assert check_indexed(importer_result(tmp_path, top_level)).returncode == 0
    missing = check_indexed(importer_result(tmp_path, [n for n in top_level if n != "remediate_drain.yml"]))
    assert missing.returncode == 1
    assert "playbooks/remediate/drain.yml" in missing.stderr and "remediate_drain.yml" in missing.stderr
    assert "importer_playbooks.py" in (TOP / "tools/ansible_sanity.sh").read_text(encoding="utf-8")


def test_the_collections_unit_tests_link_every_module_utils_test_of_the_suite():
    linked = {p.name: p for p in UNIT.glob("test_*.py")}
    suite = {p.name for p in PARSER_TESTS.glob("test_*.py")}
    assert set(linked) == suite - set(CONTROLLER_BOUND), "link the new test or name why it cannot run"
    for name, link in linked.items():
        assert link.is_symlink() and link.resolve() == (PARSER_TESTS / name).resolve(), name


@pytest.mark.parametrize("name", sorted(CONTROLLER_BOUND))
def test_a_test_left_out_of_the_collection_needs_the_controller_package(name: str):
    assert "\nfrom stethoscope." in (PARSER_TESTS / name).read_text(encoding="utf-8"), name


def test_sanity_ignores_only_the_licence_check_of_files_that_exist():
    ignores = sorted(COLLECTION_TESTS.glob("sanity/ignore-*.txt"))
    assert ignores
    for ignore in ignores:
        for line in ignore.read_text(encoding="utf-8").splitlines():
            path, check = line.split("#", 1)[0].split()
            assert check == "validate-modules:missing-gplv3-license", line
            assert (TOP / path).is_file(), line


def test_the_collections_stand_in_tools_are_the_suites(tmp_path: Path):
    """ansible-test units cannot import the suite's conftest, so the collection's keeps a copy of
    fake_tools: the two must write the same commands, or a linked test means another thing there."""
    import importlib.util

    import conftest

    path = TOP / "collections/stethoscope/tests/unit/plugins/module_utils/conftest.py"
    spec = importlib.util.spec_from_file_location("collection_unit_conftest", path)
    assert spec is not None and spec.loader is not None
    collection = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = collection  # as an import would: hypothesis' settings look it up
    try:
        spec.loader.exec_module(collection)
    finally:
        del sys.modules[spec.name]
    xml = "real/h200-vm/commands/nvidia-smi_-q_-x.xml"
    tools = {"nvidia-smi": {"-q -x": xml, "*": "exit 255"}, "ibstat": "true"}
    conftest.fake_tools(tmp_path / "suite", tmp_path / "suite.log", tools)
    collection.fake_tools(tmp_path / "copy", tmp_path / "suite.log", tools)
    for name in tools:
        assert (tmp_path / "copy" / name).read_text() == (tmp_path / "suite" / name).read_text(), name
