#!/usr/bin/env python3
"""The job-relative detector's targets on synchronous jobs over a fleet: the culprit rank found for a
straggler and an input stall, the congested switch for congestion, recall >= 0.9 each; peers of a
faulty job given a finding of their own <= 2 %; healthy jobs with any finding <= 1 %; and how long
before the jobs' steps slow down a congested switch is named. Each measured three ways side by side
(stethoscope_training/job_evaluate.py): the ONNX graphs alone (the shipped model's node findings),
the deterministic job-relative detector alone, and both (what `diagnose` runs).

Measured on the held-out job set (stethoscope_training/job_fresh.py, set jobs-2: its variants
written, and its scenes' data hash recorded, before the change it scores), and, as controls, on the
sets the detector's constants were chosen on: jobs-1 (the first hold-out, read closely after it was
scored, a development set since), the generator's validation scenes and the multi-rank families
(job_families.py).

    .venv/bin/python benchmarks/model_jobs.py [--fresh-per-family 40] [--validation-per-family 60]
        [--multi-rank-per-family 20] [--seed 2026] [--out benchmarks/results/model_jobs.json]
        [--note TEXT]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from stethoscope.model.inference import graphs_for
from stethoscope.model.metadata import load, metadata_path
from stethoscope_training import job_evaluate, job_families, job_fresh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import stamp, write_results

RESULT = Path(__file__).resolve().parent / "results" / "model_jobs.json"
TARGETS = {
    "culprit_recall_each": 0.9,
    "peers_with_own_finding_percent": 2.0,
    "healthy_jobs_with_finding_percent": 1.0,
}


def _score(graphs, scene_set) -> tuple[dict, float]:
    started = time.perf_counter()
    results = job_evaluate.evaluate_scenes(graphs, scene_set.scenes)
    scores = job_evaluate.scores(results)
    scores.update(
        split=scene_set.split,
        seed=scene_set.seed,
        per_family=scene_set.per_family,
        data_hash=scene_set.data_hash(),
    )
    return scores, time.perf_counter() - started


def _met(scores: dict, path: str) -> dict:
    entry = scores["paths"][path]
    recall = [entry[kind]["culprit_recall"] for kind in job_evaluate.FAULTS]
    return {
        "culprit_recall_each": all(r is not None and r >= TARGETS["culprit_recall_each"] for r in recall),
        "peers_with_own_finding_percent": entry["peers_with_own_finding_percent"]
        <= TARGETS["peers_with_own_finding_percent"],
        "healthy_jobs_with_finding_percent": entry["healthy_jobs_with_finding_percent"]
        <= TARGETS["healthy_jobs_with_finding_percent"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fresh-per-family", type=int, default=40)
    parser.add_argument("--validation-per-family", type=int, default=60)
    parser.add_argument("--multi-rank-per-family", type=int, default=20)
    parser.add_argument("--seed", type=int, default=2026, help="the held-out set's seed (validation: 7)")
    parser.add_argument("--model", type=Path, default=metadata_path())
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    provenance = stamp()
    meta = load(args.model)
    graphs = graphs_for(meta)
    held_out = job_fresh.scenes(args.seed, args.fresh_per_family)
    if args.seed == 2026 and args.fresh_per_family == 40 and held_out.data_hash() != job_fresh.DATA_HASH_2:
        sys.exit("the hold-out's scenes are not the ones recorded when it was written (DATA_HASH_2)")
    fresh, fresh_s = _score(graphs, held_out)
    development, development_s = _score(
        graphs, job_fresh.scenes(args.seed, args.fresh_per_family, job_fresh.SET_1)
    )
    validation, validation_s = _score(graphs, job_families.scenes(7, args.validation_per_family))
    multi_rank, multi_rank_s = _score(graphs, job_families.multi_rank_scenes(7, args.multi_rank_per_family))
    report = {
        "targets": TARGETS,
        "model": f"{meta.name} ({args.model})",
        "model_fingerprint": graphs.version,
        "fresh_set": job_fresh.SET,
        "note": args.note,
        "fresh": fresh,
        "fresh_met": {path: _met(fresh, path) for path in job_evaluate.PATHS},
        "development": development,
        "development_set": job_fresh.SET_1,
        "validation": validation,
        "validation_met": {path: _met(validation, path) for path in job_evaluate.PATHS},
        "multi_rank": multi_rank,
        "seconds": {
            "fresh": round(fresh_s, 1),
            "development": round(development_s, 1),
            "validation": round(validation_s, 1),
            "multi_rank": round(multi_rank_s, 1),
        },
    }
    print(job_evaluate.render(fresh, f"held-out set {job_fresh.SET} (seed {args.seed})"))
    print(
        job_evaluate.render(
            development, f"development set {job_fresh.SET_1} (the first hold-out, read since)"
        )
    )
    print(job_evaluate.render(validation, "validation scenes (the constants were chosen on these)"))
    print(job_evaluate.render(multi_rank, "multi-rank families (read while choosing them)"))
    write_results(args.out, report, provenance)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
