#!/usr/bin/env python3
"""The shipped model (rules/models/core12*) on fresh families (stethoscope_training/fresh.py): variants
of each fault class and of healthy nodes written before the model was trained (set 1: after it was
trained and chosen), so a clean hold-out (the test split's HELD_OUT families were seen while the
architecture was chosen). Once scored, a set becomes training data for the next model; each
scoring is a results file of its own, written whole by its run (the scorings from before
benchmarks/provenance.py, results/model_fresh_history.json, are read only to check that a set
regenerates the data it scored).
Scored as `stethoscope model evaluate` scores (stethoscope_training/evaluate.py): per-class precision,
recall, F1, macro-F1, confusion, healthy false findings; and per family: the share found (the
classifier names the class, or the outlier detector fires on a feature of its layer), the
classifier's share alone, and what the classifier called its episodes. A control runs the same
code on the generator's own test split for the same seed (the harness, not the families, is tested
there).

    .venv/bin/python benchmarks/model_fresh_families.py [--seed 2026] [--per-family 200] [--set N]
        [--json OUT] [--note TEXT]

--set N scores an earlier set kept apart as stethoscope_training/retired_holdouts/setNN.py (not one
that is training data now), checking that it regenerates the data its earlier scoring had.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from provenance import write_results

from stethoscope.model.metadata import CLASSES, load, metadata_path
from stethoscope.paths import project_root
from stethoscope_training import episodes, evaluate, fresh

RESULT = project_root() / "benchmarks" / "results" / "model_fresh_families.json"
HISTORY = RESULT.with_name("model_fresh_history.json")  # the scorings from before runs wrote whole files


def per_family(out: evaluate.Outputs, eps: episodes.Episodes) -> dict[str, dict]:
    found = (out.pred == eps.label) | (out.outlier & (out.outlier_layer == eps.label))
    families = {}
    for name in eps.info["per_family"]:  # the set's families, in its order
        members = eps.family == name
        cls = fresh.families_of(eps.info["fresh_set"])[name][0]
        said = {c: int(np.sum(out.pred[members] == j)) for j, c in enumerate(CLASSES)}
        entry = {"class": cls, "episodes": int(members.sum()), "said": said}
        if cls == "healthy":
            quiet = (out.pred == 0) & ~out.outlier
            entry["no_finding"] = round(float(quiet[members].mean()), 4)
            entry["outlier_fired"] = round(float(out.outlier[members].mean()), 4)
        else:
            entry["recall"] = round(float(found[members].mean()), 4)
            entry["classifier_recall"] = round(float((out.pred == eps.label)[members].mean()), 4)
        # the share the detector could judge (stand-in peers exist: evaluate.peer_groups)
        entry["outlier_scored"] = round(float(np.isfinite(out.score[members]).mean()), 4)
        families[name] = entry
    return families


# what makes two scorings the same one (an earlier file's entry or HISTORY's, read to check)
SAME_SCORING = ("model_fingerprint", "fresh_set", "fresh_seed", "per_family", "fresh_data_hash")


def fingerprint(meta) -> str:
    """Which model scored: its two graphs and its thresholds (the data hash alone cannot tell two
    trainings on the same data apart, e.g. after the detector's threshold was recalibrated)."""
    digest = hashlib.sha256()
    for graph in sorted(meta.graphs.values()):
        digest.update(meta.path.with_name(graph).read_bytes())
    digest.update(json.dumps(meta.thresholds, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _scorings(path: Path) -> list[dict]:
    """The scorings from before runs wrote whole files, then the one `path` holds."""
    earlier = _read(HISTORY).get("scorings", [])
    return [h for h in [*earlier, _read(path)] if isinstance(h, dict) and h]


def scored_data_hash(fresh_set: int, seed: int, per_family: int) -> str | None:
    """The data hash an earlier scoring of this set (same seed and size) recorded, if any."""
    for entry in _scorings(RESULT):
        scored = (entry.get("fresh_set"), entry.get("fresh_seed"), entry.get("per_family"))
        if scored == (fresh_set, seed, per_family):
            return entry.get("fresh_data_hash")
    return None


def repeated_note(path: Path, fresh_set: int, seed: int, per_family: int, data: str, meta) -> str | None:
    """The note of the scoring `path` holds now when this run repeats it (a note is not lost to a
    plain rerun)."""
    now = [fingerprint(meta), fresh_set, seed, per_family, data]
    for entry in _scorings(path)[-1:]:
        if [entry.get(k) for k in SAME_SCORING] == now:
            return entry.get("note")
    return None


PEER_POOL = 60  # healthy standard training jobs that stand in for the fresh episodes' peers


def outputs_with_standard_peers(meta, eps: episodes.Episodes, seed: int) -> evaluate.Outputs:
    """The graphs' outputs on the fresh episodes. A fresh set need not hold a healthy standard job
    (most do not), and without one its fault episodes would have no stand-in peers, so the
    detector could not judge them: a pool of the generator's healthy.training episodes joins them
    as peers, in the fresh split, and is never scored itself."""
    pool = episodes.generate(seed + 1, PEER_POOL)
    keep = np.flatnonzero(pool.family == "healthy.training")
    arrays = {k: np.concatenate([getattr(eps, k), getattr(pool, k)[keep]]) for k in episodes.ARRAYS}
    arrays["split"][len(eps) :] = eps.split[0]
    joined = episodes.Episodes(**arrays, info=eps.info)
    out = evaluate.run_graphs(evaluate.Graphs(meta), joined, np.arange(len(joined)), meta.seed)
    mine = slice(0, len(eps))
    return evaluate.Outputs(*(getattr(out, f.name)[mine] for f in dataclasses.fields(out)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=2026, help="generation seed (default 2026)")
    parser.add_argument("--per-family", type=int, default=200)
    parser.add_argument(
        "--set",
        type=int,
        default=fresh.SET,
        help=f"an earlier set kept as stethoscope_training/retired_holdouts/setNN.py "
        f"(default: current, {fresh.SET})",
    )
    parser.add_argument(
        "--json", type=Path, help=f"default {RESULT} (another set: model_fresh_setN.json beside it)"
    )
    parser.add_argument("--note", help="what this scoring is, kept with it")
    args = parser.parse_args()
    try:
        chosen = fresh.families_of(args.set)
    except ValueError as exc:
        parser.error(f"--set: {exc}")
    if set(chosen) & set(episodes.FAMILIES):
        parser.error(f"--set {args.set}: its families are training data now, not a hold-out")
    args.json = args.json or (
        RESULT if args.set == fresh.SET else RESULT.with_name(f"model_fresh_set{args.set}.json")
    )
    meta = load(metadata_path())
    started = time.perf_counter()
    eps = fresh.generate(args.seed, args.per_family, fresh_set=args.set)
    generated = time.perf_counter() - started
    recorded = scored_data_hash(args.set, args.seed, args.per_family)
    if recorded is not None and recorded != eps.data_hash():
        parser.error(  # exit 2: what is asked for is not the data that was scored
            f"set {args.set} regenerates other data than its earlier scoring had ({recorded[:16]}): "
            "its families or the generator changed since"
        )
    started = time.perf_counter()
    out = outputs_with_standard_peers(meta, eps, args.seed)
    scores = evaluate.score_outputs(out, eps.label, eps.family)
    seconds = time.perf_counter() - started
    print(evaluate.render(scores, f"model {meta.name} on fresh families ({seconds:.2f} s)"))
    found = per_family(out, eps)
    for name, f in found.items():
        share = f"no finding {f['no_finding']:.3f}" if "no_finding" in f else f"recall {f['recall']:.3f}"
        print(f"  {name:<36} {share}  said {f['said']}")
    figures = {
        "model": meta.name,
        "model_fingerprint": fingerprint(meta),
        "model_data_hash": meta.data_hash,
        "generator_version": next(
            (h.get("generator_version") for h in reversed(meta.history) if h.get("action") == "train"), None
        ),
        "scored_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "fresh_set": args.set,
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
        "families": found,
        "shipped_test_macro_f1": (meta.scores.get("test") or {}).get("macro_f1"),
        "generate_s": round(generated, 2),
        "evaluate_s": round(seconds, 2),
        "note": args.note
        or repeated_note(args.json, args.set, args.seed, args.per_family, eps.data_hash(), meta),
    }
    control_eps = episodes.generate(args.seed, max(30, args.per_family // 2))
    test = np.flatnonzero(control_eps.split == "test")
    out = evaluate.run_graphs(evaluate.Graphs(meta), control_eps, test, meta.seed)
    control = evaluate.score_outputs(out, control_eps.label[test], control_eps.family[test])
    figures["control_generator_test_split"] = {
        k: control[k] for k in ("episodes", "macro_f1", "healthy_false_findings_percent")
    }
    figures["per_class_f1"] = {c: v["f1"] for c, v in scores["per_class"].items()}
    print(json.dumps(figures, indent=2))
    write_results(args.json, figures, indent=2)


if __name__ == "__main__":
    main()
