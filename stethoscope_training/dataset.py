"""Episode sets as training and evaluation read them: a folder written by `tools/lab.py episodes`
(its arrays and manifest), or freshly generated with a model's recorded seed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stethoscope.model.metadata import ModelError, ModelMeta


@dataclass
class EpisodeSet:
    episodes: Any  # stethoscope_training.episodes.Episodes
    manifest: dict[str, Any]
    directory: Path | None

    @property
    def data_hash(self) -> str:
        return str(self.manifest.get("data_hash", ""))


def load_dir(directory: Path) -> EpisodeSet:
    """The episodes in DIR; a missing or damaged set is a configuration error (exit 2)."""
    from stethoscope_training import episodes

    manifest_path = directory / "episodes.json"
    if not (directory / "episodes.npz").is_file():
        raise ModelError(f"{directory}: no episodes.npz (write one with `tools/lab.py episodes --out DIR`)")
    try:
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        loaded = episodes.load(directory)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"{directory}: unreadable episodes: {exc}") from None
    return EpisodeSet(loaded, manifest, directory)


def generate_dir(
    directory: Path, seed: int, per_family: int | None = None, hw_class: str = "h200"
) -> EpisodeSet:
    """Generate episodes with the generator's defaults (or `per_family`) into DIR and read them back."""
    from stethoscope_training import episodes

    options: dict[str, Any] = {"seed": seed, "hw_class": hw_class}
    if per_family is not None:
        options["per_family"] = per_family
    try:
        generated = episodes.generate(**options)
    except episodes.EpisodesError as exc:
        raise ModelError(f"episodes: {exc}") from None
    episodes.save(generated, directory)
    return load_dir(directory)


def regenerate(meta: ModelMeta, directory: Path) -> EpisodeSet:
    """The episodes a model was trained on, generated again from its recorded seed and size."""
    trained: dict[str, Any] = next((h for h in reversed(meta.history) if h.get("action") == "train"), {})
    return generate_dir(directory, meta.seed, trained.get("per_family"))
