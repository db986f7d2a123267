"""Every file the repository cites (docs, reference notes, fixtures) is in the repository: a reader of a
rule, a docstring or the README can open what it points to."""

from __future__ import annotations

import re
import subprocess

from conftest import TOP

TEXT = (".py", ".md", ".yml", ".yaml", ".cfg", ".toml", ".sh", ".j2", ".txt", ".json")
# recorded third-party output and notes that cite other projects' own docs/ folders
NOT_SCANNED = ("tests/fixtures/", "docs/reference/")
CITED = re.compile(r"(?<![\w./${}-])((?:\.\./)*(?:docs|shared|tests/fixtures)/[\w./-]*[\w/])")
DESIGN = re.compile(r"(?<![\w/.])DESIGN\.md")


def tracked_text_files():
    listed = subprocess.run(["git", "ls-files"], cwd=TOP, capture_output=True, text=True, check=True)
    for name in listed.stdout.splitlines():
        path = TOP / name
        if name.endswith(TEXT) and not name.startswith(NOT_SCANNED) and path.is_file():
            yield name, path


def test_every_cited_file_exists_in_the_repository():
    missing = []
    for name, path in tracked_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            if DESIGN.search(line):
                missing.append(f"{name}:{number}: the design outside the repository (it is docs/design.md)")
            for cited in CITED.findall(line):
                if not ((TOP / cited).exists() or (path.parent / cited).exists()):
                    missing.append(f"{name}:{number}: {cited}")
    assert missing == []


def test_the_citation_scan_sees_what_it_checks():
    """The scan is not vacuous: it finds the rules' and the README's citations."""
    seen = {
        cited
        for _name, path in tracked_text_files()
        for cited in CITED.findall(path.read_text(encoding="utf-8", errors="replace"))
    }
    assert {"docs/reference/thresholds.md", "docs/reference/xid.md", "docs/design.md"} <= seen
    assert "tests/fixtures/public/SOURCES.md" in seen
