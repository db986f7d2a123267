"""docs/design.md "Layout": a layer imports only layers below it (evaluation never acts)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "stethoscope"

# Each layer and the layers it may import (its own included). The base modules are read by all.
BASE = {
    "aggregates",
    "catalog",
    "inventory",
    "paths",
    "timeutil",
    "templating",
    "render_worker",
    "stats",
    "names",
    "bounded_yaml",
    "terminal",
    "private_files",
    "galaxy",
    "priority",
}
BELOW = {
    "store": set(),
    "model": {"store"},
    "bench": {"store"},
    "telemetry": {"store"},
    "diagnosis": {"store", "model", "bench", "telemetry"},
    "remediation": {"store", "model", "bench", "telemetry", "diagnosis"},
    "report": {"store", "model", "bench", "telemetry", "diagnosis", "remediation"},
    "cli": {"store", "model", "bench", "telemetry", "diagnosis", "remediation", "report", "serve"},
    "serve": {"store", "model", "bench", "telemetry", "diagnosis", "remediation", "report"},
}


def _layer(module: str) -> str:
    """stethoscope.store.client -> store; stethoscope.catalog -> catalog."""
    return module.split(".")[1]


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "stethoscope":
                found.update(f"stethoscope.{alias.name}" for alias in node.names)
            elif node.module.startswith("stethoscope."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("stethoscope."))
    return found


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.stat().st_size)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_layer_imports_only_layers_below_it(path: Path) -> None:
    relative = path.relative_to(PACKAGE)
    own = relative.parts[0].removesuffix(".py")
    allowed = BASE | {own} | BELOW.get(own, set())
    if own in BASE:
        allowed = BASE
    wrong = sorted(m for m in _imports(path) if _layer(m) not in allowed)
    assert not wrong, f"{relative} ({own}) imports above its layer: {wrong}"


def test_every_layer_of_the_design_is_a_subpackage() -> None:
    for layer in ("store", "diagnosis", "remediation", "bench", "report", "cli"):
        assert (PACKAGE / layer / "__init__.py").is_file(), layer


def test_the_layering_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("from stethoscope.remediation.executor import execute\n")
    assert _imports(bad) == {"stethoscope.remediation.executor"}
    assert _layer("stethoscope.remediation.executor") not in BASE | {"diagnosis"} | BELOW["diagnosis"]


TRAINING = PACKAGE.parent / "stethoscope_training"


def _private_imports(path: Path) -> list[str]:
    """`module.name` for each private name (one leading underscore) imported from another module of
    ours, at the top or inside a function."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stethoscope"):
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_private_name_is_imported_from_another_module() -> None:
    """Regression: model/ranks.py imported features._label inside a function (around an import cycle),
    from_store.py features._hw_classes and finetune's _rehearsal, _train_heads, _write_classifier, and
    every family module imported the generator kit's helpers (families._base, _fault, ... 180
    imports): a name one module uses from another is public in it, in the runtime and in training
    alike."""
    wrong = {
        str(path.relative_to(PACKAGE.parent)): names
        for path in sorted(PACKAGE.rglob("*.py")) + sorted(TRAINING.rglob("*.py"))
        if (names := _private_imports(path))
    }
    assert wrong == {}


def _private_uses(path: Path) -> list[str]:
    """`module.name` for each private name a file imports from our packages, reads as an attribute of
    one of our modules it imported by name (`engine._matches`), or patches on one
    (`monkeypatch.setattr(engine, "_matches", ...)`). Not seen: attributes of instances
    (`store._client`), dotted strings, code in subprocess strings."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules: dict[str, str] = {}  # local name -> our module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("stethoscope"):
            for alias in node.names:
                modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("stethoscope") and alias.asname:
                    modules[alias.asname] = alias.name
    found = _private_imports(path)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{modules[node.value.id]}.{node.attr}")
        elif (  # monkeypatch.setattr(engine, "_matches", ...)
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id in modules
            and isinstance(node.args[1], ast.Constant)
            and str(node.args[1].value).startswith("_")
            and not str(node.args[1].value).startswith("__")
        ):
            found.append(f"{modules[node.args[0].id]}.{node.args[1].value}")
    return found


def test_the_public_names_check_sees_each_form_it_claims(tmp_path: Path) -> None:
    source = tmp_path / "uses.py"
    source.write_text(
        "from stethoscope.diagnosis import engine\n"
        "from stethoscope.diagnosis.engine import _hidden\n"
        "engine._matches\n"
        "monkeypatch.setattr(engine, '_reach', None)\n"
        "engine.evaluate\n"
    )
    assert sorted(_private_uses(source)) == [
        "stethoscope.diagnosis.engine._hidden",
        "stethoscope.diagnosis.engine._matches",
        "stethoscope.diagnosis.engine._reach",
    ]


def test_tests_benchmarks_and_tools_use_public_names_only() -> None:
    """Regression: tests/diagnosis/test_rules_in_parallel.py patched engine._matches and _reach and
    read _cores, and benchmarks/dedup_reads.py set engine._Builder.dedup: what another file needs is
    public where it lives."""
    top = PACKAGE.parent
    wrong = {
        str(path.relative_to(top)): names
        for folder in ("tests", "benchmarks", "tools")
        for path in sorted((top / folder).rglob("*.py"))
        if (names := _private_uses(path))
    }
    assert wrong == {}


def _module_name(path: Path, top: Path) -> str:
    parts = path.relative_to(top).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(roots: list[Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, at the top or inside a function (a lazy import that
    dodges a circle is still the circle); relative imports resolved, `from pkg import mod` is mod."""
    paths = {_module_name(p, root.parent): p for root in roots for p in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                while name and name not in paths:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    targets.add(name)
        graph[module] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def test_no_import_circles_even_through_function_level_imports() -> None:
    """Regression: diagnosis/model.py (model_findings.py now) imported diagnose.py (findings.py
    now) inside two functions (diagnose imported model), report/board.py board_html inside write()
    (board_html imports board): the shared names live below both now (diagnosis/levels.py,
    report/board_cells.py) and every import is acyclic."""
    assert cycles(import_graph([PACKAGE, TRAINING])) == []


def test_the_circle_check_sees_a_lazy_circle(tmp_path: Path) -> None:
    package = tmp_path / "stethoscope"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "a.py").write_text("from stethoscope.sub.b import f\n")
    (package / "sub" / "b.py").write_text("def f():\n    from . import a\n")
    (package / "sub" / "c.py").write_text("from stethoscope.sub import a\n")
    assert cycles(import_graph([package])) == [["stethoscope.sub.a", "stethoscope.sub.b"]]
