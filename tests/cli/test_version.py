"""`stethoscope --version`: the four versions a bug report needs (package, collection, rules, model),
each read from what this install ships, and exit 0."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

import stethoscope

from conftest import TOP

BIN = Path(sys.executable).parent


def _version_lines() -> dict[str, str]:
    ran = subprocess.run(
        [str(BIN / "stethoscope"), "--version"],
        capture_output=True,
        text=True,
        cwd=TOP,
        check=False,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert ran.stderr == ""
    lines = ran.stdout.splitlines()
    assert len(lines) == 4, ran.stdout
    return {line.split()[0]: line for line in lines}


def _rules_digest() -> str:
    """sha256 over the shipped rules/ YAML (catalog included, models/ left out): path, NUL, bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in (TOP / "rules").rglob("*") if p.suffix in (".yml", ".yaml")):
        if "models" in path.relative_to(TOP / "rules").parts:
            continue
        digest.update(path.relative_to(TOP / "rules").as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def test_version_prints_package_collection_rules_and_model_versions():
    lines = _version_lines()
    assert set(lines) == {"aicluster-stethoscope", "collection", "rules", "model"}

    pyproject = tomllib.loads((TOP / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == "aicluster-stethoscope"
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "stethoscope.__version__"}
    assert lines["aicluster-stethoscope"] == f"aicluster-stethoscope {stethoscope.__version__}"

    galaxy = yaml.safe_load((TOP / "collections/stethoscope/galaxy.yml").read_text())
    assert lines["collection"].startswith(f"collection aicluster.stethoscope {galaxy['version']} (")

    checked = subprocess.run(
        [str(BIN / "stethoscope"), "rules", "check", str(TOP / "rules")],
        capture_output=True,
        text=True,
        cwd=TOP,
        check=True,
    )
    count = int(checked.stdout.split()[0])
    assert lines["rules"].startswith(f"rules {count} rules, sha256:{_rules_digest()} (")

    model = json.loads((TOP / "rules/models/core12.json").read_text())
    last = model["history"][-1]
    expected = f"model {model['name']} {last['action']} {last['at']}, data {model['data_hash'][:16]} ("
    assert lines["model"].startswith(expected)


def test_galaxy_yml_is_read_in_one_place():
    """`--version` and serve's stethoscope_build_info read the collection's version with one function,
    so the two can never disagree on what galaxy.yml says."""
    import ast

    readers = sorted(
        path.relative_to(TOP).as_posix()
        for path in (TOP / "stethoscope").rglob("*.py")
        if any(
            isinstance(node, ast.Constant) and node.value == "galaxy.yml"
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    )
    assert readers == ["stethoscope/galaxy.py"]


@pytest.mark.parametrize(
    ("galaxy", "line", "version"),
    [
        ("namespace: acme\nname: probe\nversion: 2.3.4\n", "collection acme.probe 2.3.4 (", "2.3.4"),
        ("namespace: acme\nname: probe\n", "collection unreadable: ", "unknown"),
        ("- not a mapping\n", "collection unreadable: ", "unknown"),
        ("version: [unclosed\n", "collection unreadable: ", "unknown"),
    ],
)
def test_version_line_and_build_info_read_galaxy_yml_alike(tmp_path, monkeypatch, galaxy, line, version):
    from stethoscope import paths
    from stethoscope.cli.version import collection_line
    from stethoscope.serve.exposition import collection_version

    collection = tmp_path.joinpath("ansible_collections", "aicluster", "stethoscope")
    collection.mkdir(parents=True)
    (collection / "galaxy.yml").write_text(galaxy)
    monkeypatch.setattr(paths, "collections_path", lambda: tmp_path)
    assert collection_line().startswith(line) and collection_version() == version


def test_package_collection_and_training_share_one_version_of_at_least_1_0_0_with_a_changelog_entry():
    """galaxy-importer's strict setting wants a collection version of 1.0.0 or more; the package, the
    training distribution and the collection are released together, and the changelog names it."""
    import stethoscope_training

    galaxy = yaml.safe_load((TOP / "collections/stethoscope/galaxy.yml").read_text())
    assert str(galaxy["version"]) == stethoscope.__version__ == stethoscope_training.__version__
    major, _minor, _patch = (int(part) for part in stethoscope.__version__.split("."))
    assert major >= 1
    changelog = (TOP / "collections/stethoscope/CHANGELOG.md").read_text().splitlines()
    assert f"## {stethoscope.__version__}" in changelog
