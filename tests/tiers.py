"""Test tiers, marked by what a test uses: read from its own code, the test-module functions and
fixtures it calls (followed through the test modules it imports from), and the fixtures it requests.

    ansible   runs ansible-playbook, ansible-runner, molecule, ansible-doc or a module in a process of
              its own, or an executor that may run a remediation playbook
    lab       builds or sweeps the lab (tools/lab.py, the session's lab sweeps)
    training  trains or exports a model (torch), or generates training episodes or job scenes
    lint      ruff, yamllint, ansible-lint, deptry, the galaxy build
    cli       runs the stethoscope command in processes of its own (a second or more each)
    realtime  waits on a clock: sleeps, long-running serve/watch/agent processes
    external  starts an external program or service: slurmctld and munge, Chromium, fio, a network
              namespace, a venv with pip (the wheel's install)

`make test-fast` runs the tests with none of them; `make test` (CI) runs them all. A new test needs
no marker by hand: calling a helper that sweeps the lab marks it `lab`.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

TIERS: dict[str, str] = {
    "ansible": (
        r"ansible-playbook|ansible_runner|run_playbook\(|run_module\(|\bSweeper\(|ansible-galaxy|ansible-doc"
        r"|\bmolecule\b|\bExecutor\(|\"--execute\"|\blab_sweeps\b"
    ),
    "lab": r"tools/lab\.py|\blab_sweeps\b|\bswept_lab\(|\"lab\.py\"",
    "training": (
        r"\btorch\b|\bmodel_graphs\b|\btrain_graphs\b|\"train\"|\"finetune\""
        r"|\bregenerated\b|episodes\.generate\(|generate_dir\(|\bjob_fresh\b|\bsimulate\("
    ),
    "lint": r"\bruff\b|yamllint|ansible-lint|build_collection|\bdeptry\b",
    "realtime": r"time\.sleep\(|\bPopen\(|\"serve\"|\"watch\"|\"agent\"",
    "cli": r"\"stethoscope\.cli\"|\"-m\", \"stethoscope|\bcli\(",
    "external": (
        r"\bslurm\b|slurm_controller|SlurmCluster|chromium|shutil\.which\(\"fio\"\)|\"venv\"|\"pip\"|netns"
    ),
}
FAST_EXCLUDES = " or ".join(TIERS)
PATTERNS = {tier: re.compile(pattern) for tier, pattern in TIERS.items()}
TESTS = Path(__file__).resolve().parent


@cache
def _module(path: Path) -> tuple[dict[str, tuple[str, set[str]]], dict[str, Path]]:
    """A test module's top-level functions (name -> (source, names it uses)) and the names it imports
    from other test modules (name -> that module's path)."""
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    functions: dict[str, tuple[str, set[str]]] = {}
    imported: dict[str, Path] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            used |= {a.arg for n in ast.walk(node) if isinstance(n, ast.FunctionDef) for a in n.args.args}
            functions[node.name] = (ast.get_source_segment(source, node) or "", used)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            other = TESTS / f"{node.module}.py"
            if other.is_file():
                imported.update({alias.asname or alias.name: other for alias in node.names})
    return functions, imported


def _reached(path: Path, names: set[str]) -> str:
    """The source of every test-module function or fixture reachable from `names` in `path`."""
    seen: set[tuple[Path, str]] = set()
    pending = [(path, name) for name in names]
    parts = []
    while pending:
        where, name = pending.pop()
        if (where, name) in seen:
            continue
        seen.add((where, name))
        functions, imported = _module(where)
        if name in functions:
            source, used = functions[name]
            parts.append(source)
            pending += [(where, n) for n in used]
        elif name in imported:
            pending.append((imported[name], name))
    return "\n".join(parts)


def tiers_of(path: Path, function: str, fixtures: list[str]) -> set[str]:
    """The tiers of the test `function` of module `path` that requests `fixtures`."""
    conftest = TESTS / "conftest.py"
    code = _reached(path, {function, *fixtures})
    code += "\n" + _reached(conftest, set(fixtures))
    code += "\n" + " ".join(fixtures)
    return {tier for tier, pattern in PATTERNS.items() if pattern.search(code)}


def mark(items) -> None:
    """pytest_collection_modifyitems: each collected test gets the markers of its tiers."""
    import pytest

    for item in items:
        function = getattr(item, "function", None)
        if function is None:
            continue
        name = item.cls.__name__ if item.cls is not None else function.__name__
        for tier in sorted(tiers_of(Path(str(item.fspath)), name, list(item.fixturenames))):
            item.add_marker(getattr(pytest.mark, tier))
