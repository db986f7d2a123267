"""Code says why, not which issue: no comment or docstring of the project's code names a tracker
number (the word issue and a number), which a reader outside this project's tracker cannot follow. An upstream
project's issue cited as a source ("nwipe issue #547") names its project and keeps its `#`."""

from __future__ import annotations

import re
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
FOLDERS = (
    "stethoscope",
    "stethoscope_training",
    "training",
    "plugins",
    "roles",
    "playbooks",
    "tools",
    "benchmarks",
    "tests",
    "molecule",
    "collections",
    "inventories",
    "rules",
)
SUFFIXES = {".py", ".yml", ".yaml", ".sh", ".j2", ".cfg", ".toml"}
TRACKER = re.compile(r"\bissues? \d", re.IGNORECASE)


def _code_files() -> list[Path]:
    found = [TOP / "Makefile", TOP / "ansible.cfg", TOP / "pyproject.toml"]
    for folder in FOLDERS:
        for path in (TOP / folder).rglob("*"):
            if path.suffix in SUFFIXES and "fixtures" not in path.parts and path.is_file():
                found.append(path)
    return found


def test_no_tracker_numbers_in_code() -> None:
    files = _code_files()
    assert len(files) > 300
    hits = [
        f"{path.relative_to(TOP)}:{number}: {line.strip()[:100]}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if TRACKER.search(line)
    ]
    assert not hits, "tracker numbers in code (say why, not which issue):\n" + "\n".join(hits)
