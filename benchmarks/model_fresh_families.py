#!/usr/bin/env python3
"""The shipped model (rules/models/core12*) on fresh families (stethoscope/model/fresh.py): variants
of each fault class and of healthy nodes written after the model was trained and chosen, so a
clean hold-out (the test split's HELD_OUT families were seen while the architecture was chosen).
Scored as `stethoscope model evaluate` scores (stethoscope/model/evaluate.py): per-class precision,
recall, F1, macro-F1, confusion, healthy false findings; and per family: the share found (the
classifier names the class, or the outlier detector fires on a feature of its layer), the
classifier's share alone, and what the classifier called its episodes. A control runs the same
code on the generator's own test split for the same seed (the harness, not the families, is tested
there).

    .venv/bin/python benchmarks/model_fresh_families.py [--seed 2026] [--per-family 200] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from stethoscope.model import episodes, evaluate, fresh
from stethoscope.model.metadata import CLASSES, load, metadata_path
from stethoscope.paths import project_root

RESULT = project_root() / "benchmarks" / "results" / "model_fresh_families.json"


def per_family(out: evaluate.Outputs, eps: episodes.Episodes) -> dict[str, dict]:
    found = (out.pred == eps.label) | (out.outlier & (out.outlier_layer == eps.label))
    families = {}
    for name, (cls, _) in fresh.FRESH.items():
        members = eps.family == name
        said = {c: int(np.sum(out.pred[members] == j)) for j, c in enumerate(CLASSES)}
        entry = {"class": cls, "episodes": int(members.sum()), "said": said}
        if cls == "healthy":
            quiet = (out.pred == 0) & ~out.outlier
            entry["no_finding"] = round(float(quiet[members].mean()), 4)
            entry["outlier_fired"] = round(float(out.outlier[members].mean()), 4)
        else:
            entry["recall"] = round(float(found[members].mean()), 4)
            entry["classifier_recall"] = round(float((out.pred == eps.label)[members].mean()), 4)
        families[name] = entry
    return families


def history(path: Path, figures: dict) -> list[dict]:
    """The earlier runs' headline figures, one per (model, fresh set): a hold-out is scored once
    before it becomes training data, and that score is kept here after it has."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    kept = [h for h in earlier.get("history", []) if isinstance(h, dict)]
    entry = {k: earlier.get(k) for k in HEADLINE}
    entry["fresh_set"] = entry["fresh_set"] or 1  # set 1's file predates the field
    key = ("model_data_hash", "fresh_set")
    if [entry[k] for k in key] != [figures[k] for k in key] and entry not in kept:
        kept.append(entry)
    return kept


HEADLINE = (
    "model",
    "model_data_hash",
    "fresh_set",
    "fresh_seed",
    "fresh_data_hash",
    "macro_f1",
    "healthy_false_findings_percent",
    "healthy_false_classifier_percent",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=2026, help="generation seed (default 2026)")
    parser.add_argument("--per-family", type=int, default=200)
    parser.add_argument("--json", type=Path, default=RESULT)
    args = parser.parse_args()
    meta = load(metadata_path())
    started = time.perf_counter()
    eps = fresh.generate(args.seed, args.per_family)
    generated = time.perf_counter() - started
    index = np.arange(len(eps))
    started = time.perf_counter()
    out = evaluate.run_graphs(evaluate.Graphs(meta), eps, index, meta.seed)
    scores = evaluate.score_outputs(out, eps.label, eps.family)
    seconds = time.perf_counter() - started
    print(evaluate.render(scores, f"model {meta.name} on fresh families ({seconds:.2f} s)"))
    families = per_family(out, eps)
    for name, f in families.items():
        share = f"no finding {f['no_finding']:.3f}" if "no_finding" in f else f"recall {f['recall']:.3f}"
        print(f"  {name:<36} {share}  said {f['said']}")
    figures = {
        "model": meta.name,
        "model_data_hash": meta.data_hash,
        "fresh_set": fresh.SET,
        "fresh_seed": args.seed,
        "per_family": args.per_family,
        "fresh_data_hash": eps.data_hash(),
        "episodes": scores["episodes"],
        "macro_f1": scores["macro_f1"],
        "accuracy": scores["accuracy"],
        "per_class": scores["per_class"],
        "classes": list(CLASSES),
        "confusion": scores["confusion"],
        "healthy_false_findings_percent": scores["healthy_false_findings_percent"],
        "healthy_false_classifier_percent": scores["healthy_false_classifier_percent"],
        "outlier": scores["outlier"],
        "families": families,
        "shipped_test_macro_f1": (meta.scores.get("test") or {}).get("macro_f1"),
        "generate_s": round(generated, 2),
        "evaluate_s": round(seconds, 2),
    }
    control_eps = episodes.generate(args.seed, max(30, args.per_family // 2))
    test = np.flatnonzero(control_eps.split == "test")
    out = evaluate.run_graphs(evaluate.Graphs(meta), control_eps, test, meta.seed)
    control = evaluate.score_outputs(out, control_eps.label[test], control_eps.family[test])
    figures["control_generator_test_split"] = {
        k: control[k] for k in ("episodes", "macro_f1", "healthy_false_findings_percent")
    }
    figures["history"] = history(args.json, figures)
    print(json.dumps(figures, indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
