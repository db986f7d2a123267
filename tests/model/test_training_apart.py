"""Training out of the runtime (docs/design.md "Layout"): the episode generators, fresh
sets, training and evaluation live in `stethoscope_training`, which the runtime never imports; the
CLI's `model train|evaluate|finetune` import it lazily and say so, exit 2, where it is missing."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
RUNTIME = TOP / "stethoscope"
TRAINING = TOP / "stethoscope_training"
# what the training package may build on: the runtime's layers up to diagnosis (it replays rules on
# episodes), never what acts or shows
TRAINING_MAY_USE = {"catalog", "paths", "timeutil", "stats", "names", "store", "model", "diagnosis"}


def _imported(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_serving_and_diagnosing_load_no_generator_and_no_torch() -> None:
    probe = (
        "import sys, json\n"
        "import stethoscope.serve, stethoscope.cli.main, stethoscope.diagnosis.model_findings\n"
        "import stethoscope.model.findings, stethoscope.model.features\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('stethoscope_training') "
        "or m == 'torch' or m.rsplit('.', 1)[-1].startswith(('families', 'episodes', 'fresh', 'nets')))))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=TOP)
    assert json.loads(done.stdout) == []


@pytest.mark.parametrize("path", sorted(RUNTIME.rglob("*.py")), ids=lambda p: str(p.relative_to(TOP)))
def test_the_runtime_never_imports_the_training_package(path: Path) -> None:
    assert not [m for m in _imported(path) if m.split(".")[0] == "stethoscope_training"]


@pytest.mark.parametrize("path", sorted(TRAINING.glob("*.py")), ids=lambda p: p.name)
def test_the_training_package_builds_on_the_runtime_below_what_acts(path: Path) -> None:
    layers = {m.split(".")[1] for m in _imported(path) if m.startswith("stethoscope.")}
    assert layers <= TRAINING_MAY_USE, f"{path.name} imports {sorted(layers - TRAINING_MAY_USE)}"


BLOCKED = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "stethoscope_training":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from stethoscope.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(
    "command", [["model", "evaluate"], ["model", "train"], ["model", "finetune", "--from-faults"]]
)
def test_without_the_training_package_the_cli_says_so_exit_2(command: list[str], tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, "--dsn", f"chdb://{tmp_path / 'db'}", *command],
        capture_output=True,
        text=True,
        cwd=TOP,
    )
    assert done.returncode == 2, done.stderr
    assert "the training package (stethoscope_training) is not installed" in done.stderr
    # and `model info` needs the runtime alone
    info = subprocess.run(
        [sys.executable, "-c", BLOCKED, "model", "info"], capture_output=True, text=True, cwd=TOP
    )
    assert info.returncode == 0, info.stderr
