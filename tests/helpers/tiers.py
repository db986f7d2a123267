"""Test tiers: what makes a test slow, marked at collection so that `-m` can leave it out.

    ansible   runs ansible-playbook, ansible-runner, molecule, ansible-doc or a module in a process of
              its own, or an executor that may run a remediation playbook
    lab       builds or sweeps the lab (tools/lab.py, the session's lab sweeps)
    training  trains or exports a model (torch), or generates training episodes or job scenes
    lint      ruff, yamllint, ansible-lint, deptry, the galaxy build
    cli       runs the stethoscope command in processes of its own (a second or more each)
    realtime  waits on a clock: sleeps, long-running serve/watch/agent processes
    external  starts an external program or service: slurmctld and munge, Chromium, fio, a network
              namespace, a venv with pip (the wheel's install)
    e2e       the whole loop on the lab, several layers and processes at once (tests/e2e/)

A test's tiers come from three places, in this order of authority:
- its folder (FOLDER_TIERS): every test of tests/e2e/ is e2e;
- the fixtures it requests, directly or through other fixtures (FIXTURE_TIERS): `slurm` starts the
  real slurmctld, `lab_sweeps` sweeps the lab with collect.yml;
- what its code calls, names or runs (NAMES, CALLED, WORDS, IN_STRINGS, the scripts, argv[0]s and
  console scripts it runs: read from its syntax tree, not its text), followed through the test-module
  functions, helpers and module-level strings it reaches and the test modules it imports them from
  (under whatever name): calling conftest's `swept_lab` marks it lab, ansible and cli.

`make test-fast` runs the tests with none of them; `make test` (CI) runs them all. A new test needs
no marker by hand.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

TIERS: dict[str, str] = {
    "ansible": "runs Ansible in a process of its own",
    "lab": "builds or sweeps the lab",
    "training": "trains a model or generates training data",
    "lint": "runs a linter or the galaxy build",
    "realtime": "waits on a clock",
    "cli": "runs the stethoscope command in processes of its own",
    "external": "starts an external program or service",
    "e2e": "the whole loop on the lab (tests/e2e/)",
}
FAST_EXCLUDES = " or ".join(TIERS)
TESTS = Path(__file__).resolve().parents[1]

FOLDER_TIERS: dict[str, set[str]] = {"e2e": {"e2e"}}
FIXTURE_TIERS: dict[str, set[str]] = {
    "slurm_controller": {"external"},  # a real slurmctld and munged (`slurm` requests it)
    "lab_sweeps": {"lab", "ansible"},  # three real collect.yml sweeps of the lab
}
# what a test's reachable code calls that makes it slow: helpers and libraries by name (a call, an
# attribute or an import), programs by their argv words (string constants), programs by a part of a path
NAMES: dict[str, set[str]] = {  # named at all: imported, called, passed on
    "ansible": {"ansible_runner"},
    "training": {"torch", "model_graphs", "train_graphs", "regenerated", "job_fresh"},
    "external": {"SlurmCluster", "slurm_with_slurmd"},  # the latter: conftest's slurmctld with a slurmd
}
CALLED: dict[str, set[str]] = {  # called, by name or dotted name
    "ansible": {"run_playbook", "run_module", "Sweeper", "Executor"},
    "lab": {"swept_lab"},
    "training": {"simulate", "generate_dir", "episodes.generate"},
    "realtime": {"Popen", "time.sleep"},
    "cli": {"cli"},
}
SCRIPTS_IMPORTING = {"stethoscope.cli": "cli"}  # `python -c "import stethoscope.cli.main ..."`
SHELL_STARTS = {"sleep ": "realtime"}  # sh -c "sleep 30"
ARGV0 = {"timeout": "realtime", "mount": "external", "umount": "external"}  # ["timeout", "5", ...]
WORDS: dict[str, set[str]] = {
    "ansible": {"--execute"},
    "lab": {"lab.py"},
    "training": {"train", "finetune"},
    "realtime": {"serve", "watch", "agent"},
    "cli": {"stethoscope.cli"},
    "external": {"venv", "pip"},
}
IN_STRINGS: dict[str, tuple[str, ...]] = {
    "ansible": ("ansible-playbook", "ansible-galaxy", "ansible-doc", "molecule"),
    "lab": ("tools/lab.py",),
    "training": ("torch",),  # torch imported, blocked or checked for in a process of the test's own
    "lint": ("ruff", "yamllint", "ansible-lint", "build_collection", "deptry"),
    "external": ("chromium", "netns"),
}
PROGRAMS_LOOKED_UP = {"fio": "external"}  # shutil.which("fio"): the real program runs
CONSOLE_SCRIPTS = {"stethoscope": "cli"}  # BIN / "stethoscope", python.parent / "stethoscope": it runs
BIN_FOLDERS = {"BIN", "parent"}  # the console scripts' folder: the interpreter's (not TOP / "stethoscope")


@cache
def _test_modules() -> dict[str, Path]:
    """Every importable module of the suite by name (the folders are on sys.path: conftest.py)."""
    return {
        path.stem: path
        for path in sorted(TESTS.rglob("*.py"))
        if "fixtures" not in path.relative_to(TESTS).parts
    }


def _uses(node: ast.AST) -> set[str]:
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    return used | {a.arg for n in ast.walk(node) if isinstance(n, ast.FunctionDef) for a in n.args.args}


def _is_script(value: ast.AST | None) -> bool:
    """A module-level string: a script a test may run (a list of names is not followed: it names
    every case's command, like a parametrize list)."""
    return isinstance(value, ast.Constant | ast.JoinedStr) and not isinstance(
        getattr(value, "value", ""), bytes
    )


@cache
def _module(path: Path) -> tuple[dict[str, tuple[ast.AST, set[str]]], dict[str, tuple[Path, str]]]:
    """A test module's top-level functions and constants (name -> (node, names it uses)) and the names
    it imports from other test modules (name here -> (that module's path, the name there))."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions: dict[str, tuple[ast.AST, set[str]]] = {}
    imported: dict[str, tuple[Path, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            functions[node.name] = (node, _uses(node))
        elif isinstance(node, ast.Assign | ast.AnnAssign) and _is_script(node.value):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):  # a constant the reached code uses: its strings count
                    functions[target.id] = (node.value, _uses(node.value))
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            other = _test_modules().get(node.module)
            if other is not None:
                imported.update({alias.asname or alias.name: (other, alias.name) for alias in node.names})
    return functions, imported


def _reached(path: Path, names: set[str]) -> list[ast.AST]:
    """Every test-module function or fixture reachable from `names` in `path`."""
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
            node, used = functions[name]
            parts.append(node)
            pending += [(where, n) for n in used]
        elif name in imported:
            pending.append(imported[name])
    return parts


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _walk_bodies(root: ast.AST):
    """ast.walk without decorators: a parametrize list names every case's words, not this case's."""
    pending = [root]
    while pending:
        node = pending.pop()
        yield node
        for field, value in ast.iter_fields(node):
            if field == "decorator_list":
                continue
            children = value if isinstance(value, list) else [value]
            pending += [child for child in children if isinstance(child, ast.AST)]


def called_tiers(code: list[ast.AST]) -> set[str]:
    """The tiers of what `code` names, calls or runs (NAMES, CALLED, WORDS, IN_STRINGS)."""
    names: set[str] = set()
    called: set[str] = set()
    strings: set[str] = set()
    for node in (n for root in code for n in _walk_bodies(root)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names |= {node.attr, _dotted(node)}
        elif isinstance(node, ast.alias):
            names.add(node.name)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
        if isinstance(node, ast.Call):
            called |= {_dotted(node.func), _dotted(node.func).rpartition(".")[2]}
        if isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant):
            names.add(f"argv0:{node.elts[0].value}")
        if isinstance(node, ast.BinOp) and isinstance(node.right, ast.Constant):  # BIN / "stethoscope"
            names.add(f"{_dotted(node.left).rpartition('.')[2]}/{node.right.value}")
        if isinstance(node, ast.Call) and _dotted(node.func) == "shutil.which" and node.args:
            looked_up = node.args[0]
            if isinstance(looked_up, ast.Constant) and looked_up.value in PROGRAMS_LOOKED_UP:
                names.add(f"shutil.which:{looked_up.value}")
    tiers = {tier for tier, known in NAMES.items() if names & known}
    tiers |= {tier for tier, known in CALLED.items() if called & known}
    tiers |= {tier for tier, words in WORDS.items() if strings & words}
    tiers |= {tier for tier, parts in IN_STRINGS.items() if any(p in s for s in strings for p in parts)}
    tiers |= {tier for program, tier in PROGRAMS_LOOKED_UP.items() if f"shutil.which:{program}" in names}
    tiers |= {
        tier
        for script, tier in CONSOLE_SCRIPTS.items()
        for folder in BIN_FOLDERS
        if f"{folder}/{script}" in names
    }
    scripts = [s for s in strings if "import " in s]
    tiers |= {tier for module, tier in SCRIPTS_IMPORTING.items() if any(module in s for s in scripts)}
    tiers |= {tier for program, tier in ARGV0.items() if f"argv0:{program}" in names}
    tiers |= {tier for start, tier in SHELL_STARTS.items() if any(s.startswith(start) for s in strings)}
    return tiers


def folder_tiers(path: Path) -> set[str]:
    """The tiers of the folders under tests/ that hold `path`."""
    try:
        folders = path.resolve().relative_to(TESTS).parts[:-1]
    except ValueError:
        return set()
    return {tier for folder in folders for tier in FOLDER_TIERS.get(folder, ())}


def fixture_tiers(fixtures: list[str]) -> set[str]:
    return {tier for fixture in fixtures for tier in FIXTURE_TIERS.get(fixture, ())}


def tiers_of(path: Path, function: str, fixtures: list[str]) -> set[str]:
    """The tiers of the test `function` of module `path` that requests `fixtures` (pytest's closure of
    them: the fixtures the requested ones request too)."""
    code = _reached(path, {function, *fixtures}) + _reached(TESTS / "conftest.py", set(fixtures))
    return folder_tiers(path) | fixture_tiers(fixtures) | called_tiers(code)


def mark(items) -> None:
    """pytest_collection_modifyitems: each collected test gets the markers of its tiers."""
    import pytest

    for item in items:
        function = getattr(item, "function", None)
        if function is None:
            continue
        name = item.cls.__name__ if item.cls is not None else function.__name__
        for tier in sorted(tiers_of(Path(item.path), name, list(item.fixturenames))):
            item.add_marker(getattr(pytest.mark, tier))
