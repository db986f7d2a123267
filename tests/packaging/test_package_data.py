"""Runtime code never reads the test tree (an installed package has no tests/): what it needs, the
recorded H200 capture the lab replays and the generator calibrates on, is package data
(stethoscope/data/, declared in pyproject.toml), a byte-for-byte copy with its attribution."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from stethoscope import paths

TOP = Path(__file__).resolve().parents[2]
RUNTIME = (TOP / "stethoscope", TOP / "stethoscope_training")
TEST_TREE = re.compile(r"(^|[/\\])(tests|fixtures)([/\\]|$)")
FIXTURE = TOP / "tests/fixtures/real/h200-vm/under-load/query_gpu_timeseries_2hz.csv"


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def names_of_the_test_tree(path: Path) -> list[str]:
    """The string constants of `path` (docstrings aside: prose may name a test) naming tests/ or a
    fixtures/ folder: a path the module would read."""
    tree = ast.parse(path.read_text(), filename=str(path))
    prose = _docstrings(tree)
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in prose
        and TEST_TREE.search(node.value)
    ]


@pytest.mark.parametrize(
    "path",
    [p for root in RUNTIME for p in sorted(root.rglob("*.py"))],
    ids=lambda p: str(p.relative_to(TOP)),
)
def test_no_runtime_module_reads_the_test_tree(path: Path) -> None:
    """Regression: telemetry/lab.py and stethoscope_training/families.py read
    tests/fixtures/real/h200-vm/under-load/query_gpu_timeseries_2hz.csv."""
    assert names_of_the_test_tree(path) == []


def test_the_check_sees_a_test_path(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    fixture = "/".join(("tests", "fixtures", "x.csv"))  # not a citation of a file (test_citations)
    module.write_text(
        f'"""Checked by tests/test_x.py."""\nA = "{fixture}"\nB = ROOT / "tests" / "x"\nC = "latest"\n'
    )
    assert names_of_the_test_tree(module) == [f"2: '{fixture}'", "3: 'tests'"]


def test_the_capture_is_package_data_and_the_fixture_unedited() -> None:
    shipped = paths.h200_capture()
    assert shipped.is_relative_to(TOP / "stethoscope" / "data")
    assert shipped.read_bytes() == FIXTURE.read_bytes()
    declared = tomllib.loads((TOP / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/**/*" in declared["stethoscope"]
    attribution = (TOP / "stethoscope/data/README.md").read_text()
    assert "tests/fixtures/real/h200-vm/under-load/query_gpu_timeseries_2hz.csv" in attribution


def test_the_lab_agents_and_the_generator_read_it_from_anywhere(tmp_path, monkeypatch) -> None:
    """STETHOSCOPE_HOME elsewhere (a project folder without tests/) and another working directory."""
    from stethoscope.telemetry import lab

    monkeypatch.setenv("STETHOSCOPE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)

    class Keys:
        def key_for(self, node_id):
            return 7, b"k" * 16

    class Set:
        period = 5

        def render(self):
            return {}

    config = lab.agent_config("node01", Keys(), Set(), "127.0.0.1:1", tmp_path)  # type: ignore[arg-type]
    source = Path(config["gpu_source"].removeprefix("capture:"))
    assert source == paths.h200_capture() and source.is_file()
    families = pytest.importorskip("stethoscope_training.families")
    capture = families.Capture.read()
    assert len(capture.idle) and len(capture.load)
    assert not TEST_TREE.search(str(families.CAPTURE))


def test_the_lab_inventory_replays_the_package_copy() -> None:
    text = (TOP / "inventories/lab/group_vars/all.yml").read_text()
    (line,) = [line for line in text.splitlines() if line.startswith("push_agent_gpu_source:")]
    assert "stethoscope/data/h200-vm-under-load/query_gpu_timeseries_2hz.csv" in line
    assert not TEST_TREE.search(line)
