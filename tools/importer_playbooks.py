"""Fails when galaxy-importer left a playbook of the collection out of what it indexed.

    python tools/importer_playbooks.py importer_result.json playbooks/

galaxy-importer (tools/ansible_sanity.sh runs it in `make lint`) writes importer_result.json: its
`contents` name each playbook it indexed by file name, and it indexes only the files at the top of
playbooks/. So a playbook at the top must be there under its own name, and a nested one
(playbooks/remediate/drain.yml) under its entry point's (remediate_drain.yml, which imports it).
Exit 1 naming each playbook missing; 0 when every one is indexed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

NOT_PLAYBOOKS = {"templates"}  # folders of playbooks/ that hold no playbook


def indexed_name(playbook: Path, playbooks: Path) -> str:
    """The name galaxy-importer indexes `playbook` under: its own, or its entry point's."""
    return playbook.relative_to(playbooks).as_posix().replace("/", "_")


def playbooks_of(folder: Path) -> list[Path]:
    found = [*folder.glob("*.yml"), *folder.glob("*.yaml")]
    for nested in sorted(p for p in folder.iterdir() if p.is_dir() and p.name not in NOT_PLAYBOOKS):
        found += [*nested.glob("*.yml"), *nested.glob("*.yaml")]
    return sorted(found)


def missing(result: dict, folder: Path) -> list[str]:
    indexed = {c.get("name") for c in result.get("contents", []) if c.get("content_type") == "playbook"}
    problems = []
    for playbook in playbooks_of(folder):
        name = indexed_name(playbook, folder)
        if name not in indexed:
            shown = f"playbooks/{playbook.relative_to(folder).as_posix()}"
            via = "" if name == playbook.name else f" (through its entry point {name})"
            problems.append(f"{shown}: not indexed by galaxy-importer{via}")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    result = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    problems = missing(result, Path(argv[1]))
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
