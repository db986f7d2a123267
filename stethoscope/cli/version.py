"""`stethoscope --version`: the four versions that name what this install runs, one line each.

    aicluster-stethoscope 1.0.0                      the package (stethoscope.__version__, which
                                                     pyproject.toml reads too)
    collection aicluster.stethoscope 1.0.0 (DIR)     galaxy.yml of the collection the package runs
    rules 101 rules, sha256:0123456789ab (DIR)       the rules the package loads: how many are valid,
                                                     and a digest of every YAML file under rules/
                                                     (metrics.yml and telemetry.yml included, models/
                                                     left out): any edit changes it
    model core12 train 2026-12-02T04:41:56+00:00, data ae2397db719fa3b1 (FILE)
                                                     the model diagnose loads (a fine-tuned one first):
                                                     its last training or fine-tuning and the hash of
                                                     its training data

A part that cannot be read says why on its line; the exit status stays 0 (a bug report wants the
other three all the same). Computed only when asked: loading the rules takes a moment."""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import stethoscope
from stethoscope.catalog import Catalog, CatalogError
from stethoscope.galaxy import GalaxyUnreadable, installed_collection
from stethoscope.model import metadata
from stethoscope.paths import rules_dir

DISTRIBUTION = "aicluster-stethoscope"  # on the package index; the import package is `stethoscope`


def package_line() -> str:
    return f"{DISTRIBUTION} {stethoscope.__version__}"


def collection_line() -> str:
    try:
        collection = installed_collection()
    except GalaxyUnreadable as exc:
        return f"collection unreadable: {exc}"
    return f"collection {collection.name} {collection.version} ({collection.folder})"


def rules_digest(folder: Path) -> str:
    """sha256 over every YAML file under `folder` but models/, in path order: the path, NUL, the bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.suffix in (".yml", ".yaml")):
        relative = path.relative_to(folder)
        if "models" in relative.parts:
            continue
        digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def rules_line() -> str:
    from stethoscope.diagnosis.rules import load_rules

    folder = rules_dir()
    try:
        loaded = load_rules(folder, Catalog.load())
        problems = f", {len(loaded.errors)} problems" if loaded.errors else ""
        return f"rules {len(loaded.rules)} rules, sha256:{rules_digest(folder)}{problems} ({folder})"
    except (OSError, CatalogError) as exc:
        return f"rules unreadable: {folder}: {exc}"


def model_line() -> str:
    try:
        meta = metadata.load(metadata.metadata_path())
    except (OSError, metadata.ModelError) as exc:
        return f"model unreadable: {exc}"
    last = meta.history[-1] if meta.history else {}
    trained = f"{last.get('action', 'untracked')} {last.get('at', 'at an unknown time')}"
    return f"model {meta.name} {trained}, data {meta.data_hash[:16] or 'unhashed'} ({meta.path})"


def versions() -> list[str]:
    return [package_line(), collection_line(), rules_line(), model_line()]


class PrintVersions(argparse.Action):
    """`--version`: prints versions() and exits 0, before any subcommand is required."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the package, collection, rules and model versions and exit")
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print("\n".join(versions()))
        parser.exit()
