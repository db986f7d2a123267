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
pytestmark = pytest.mark.cli


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
