"""Every role has the README Galaxy's importer asks for: its variables exactly those of its
meta/argument_specs.yml (tools/role_readmes.py generates the table) and an example playbook that calls
it by its FQCN."""

from __future__ import annotations

import re

import pytest
import yaml
from role_readmes import BEGIN, END, option_names, roles, stale_readmes

from conftest import TOP

ROLES = sorted(p.name for p in (TOP / "roles").iterdir() if p.is_dir())
ROW = re.compile(r"^\| `([^`]+)` \|")


def _readme(role: str) -> str:
    path = TOP / "roles" / role / "README.md"
    assert path.is_file(), f"{path} is missing"
    return path.read_text(encoding="utf-8")


def test_the_script_sees_every_role():
    assert [p.name for p in roles()] == ROLES and len(ROLES) >= 11


@pytest.mark.parametrize("role", ROLES)
def test_readme_lists_exactly_the_argument_specs_variables(role):
    text = _readme(role)
    assert BEGIN in text and END in text
    table = text[text.index(BEGIN) : text.index(END)]
    listed = [m.group(1) for line in table.splitlines() if (m := ROW.match(line))]
    assert listed == option_names(TOP / "roles" / role)


@pytest.mark.parametrize("role", ROLES)
def test_readme_says_what_the_role_does_and_shows_it_by_fqcn(role):
    text = _readme(role)
    assert text.startswith(f"# aicluster.stethoscope.{role}\n")
    prose = text[: text.index(BEGIN)]
    assert len(prose.split()) > 40, "say what the role does, from its tasks"
    examples = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert examples, "an example playbook"
    plays = yaml.safe_load(examples[0])
    assert isinstance(plays, list) and all("hosts" in play for play in plays)
    called = yaml.safe_dump(plays)
    assert f"aicluster.stethoscope.{role}" in called


def test_every_table_is_what_the_specs_generate():
    assert stale_readmes() == []
