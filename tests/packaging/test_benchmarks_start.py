"""Every benchmark script starts: its imports resolve from a checkout (the tests' helpers moved once
and two benchmarks stopped at their first import, unnoticed until they were run) and `--help`
answers. A benchmark is run by hand, rarely; this is what keeps it runnable between runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    path for path in (TOP / "benchmarks").glob("*.py") if "__main__" in path.read_text(encoding="utf-8")
)


def test_benchmarks_found() -> None:
    assert len(SCRIPTS) > 20


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.name)
def test_benchmark_answers_help(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), "--help"],
        cwd=TOP,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{script.name} --help exited {proc.returncode}:\n{proc.stderr[-1500:]}"
    assert "usage:" in proc.stdout
