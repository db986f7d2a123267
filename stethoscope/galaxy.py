"""The collection's name and version as its galaxy.yml says: read by `stethoscope --version` and by
serve's stethoscope_build_info, with this one function, so the two never disagree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from stethoscope.paths import collection_dir


class GalaxyUnreadable(Exception):
    """galaxy.yml missing, not YAML, or without namespace, name and version: the message says which."""


@dataclass(frozen=True)
class Collection:
    name: str  # namespace.name
    version: str
    folder: Path


def installed_collection() -> Collection:
    """The collection the package runs (paths.collection_dir())."""
    folder = collection_dir()
    path = folder / "galaxy.yml"
    try:
        galaxy = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Collection(f"{galaxy['namespace']}.{galaxy['name']}", str(galaxy["version"]), folder)
    except (OSError, yaml.YAMLError, KeyError, TypeError) as exc:
        raise GalaxyUnreadable(f"{path}: {exc}") from None
