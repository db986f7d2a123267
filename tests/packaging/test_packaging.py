"""The package declares what it imports: every third-party module that stethoscope/ imports, at the
top or inside a function, comes from a distribution pyproject.toml lists as a dependency; deptry (in
`make lint`) says the same of both distributions, and that each dependency is used."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import TOP

# imported by files that run on the nodes, not on the controller (pyproject.toml's py38 files): the
# agent's optional NVML reader
NODE_SIDE = {"pynvml"}
FIRST_PARTY = {"stethoscope", "stethoscope_training"}


def _imported_modules() -> dict[str, str]:
    """Top-level module name -> the first file importing it, for stethoscope/ (its links left out); the
    node-side files' imports of their siblings (copied beside them onto the nodes) are no modules."""
    found: dict[str, str] = {}
    for path in sorted((TOP / "stethoscope").rglob("*.py")):
        if "shipped" in path.relative_to(TOP).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if not (path.parent / f"{top}.py").is_file():
                    found.setdefault(top, str(path.relative_to(TOP)))
    return found


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_is_a_declared_dependency():
    declared = tomllib.loads((TOP / "pyproject.toml").read_text())["project"]["dependencies"]
    declared_names = {_normalised(re.split(r"[<>=!~;\[ ]", requirement)[0]) for requirement in declared}
    providers = importlib.metadata.packages_distributions()
    undeclared = {}
    for module, where in _imported_modules().items():
        if module in sys.stdlib_module_names or module in FIRST_PARTY | NODE_SIDE:
            continue
        distributions = {_normalised(d) for d in providers.get(module, [module])}
        if not distributions & declared_names:
            undeclared[module] = where
    assert undeclared == {}, f"imported but not in pyproject.toml's dependencies: {undeclared}"


def _deptry(root: str, cwd: Path) -> subprocess.CompletedProcess:
    deptry = Path(sys.executable).parent / "deptry"
    return subprocess.run(
        [str(deptry), "--no-ansi", root], cwd=cwd, capture_output=True, text=True, check=False, timeout=300
    )


@pytest.mark.parametrize(("root", "project"), [("stethoscope", "."), ("stethoscope_training", "training")])
def test_deptry_finds_every_import_declared_and_every_dependency_used(root, project):
    """What `make lint` runs: each distribution's imports against its own pyproject.toml."""
    checked = _deptry(root, TOP / project)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]


def test_make_lint_runs_deptry_on_both_distributions():
    lint = re.search(r"^lint:.*?(?=^\S)", (TOP / "Makefile").read_text(), re.MULTILINE | re.DOTALL)
    assert lint is not None
    assert re.search(r"deptry stethoscope$", lint.group(0), re.MULTILINE)
    assert re.search(r"cd training && .*deptry stethoscope_training$", lint.group(0), re.MULTILINE)
