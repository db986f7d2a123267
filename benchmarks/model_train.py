#!/usr/bin/env python3
"""Training the learned diagnosis: time on 1-2 threads, held-out scores, reproducibility (the same
seed twice), and fine-tuning a shifted hardware class (accuracy before and after, the old classes
after). Targets: training reproducible within 0.01; fine-tune >= 0.85 after on the new
class, old classes within 2 points. Writes nothing under rules/ (a temp folder).

    .venv/bin/python benchmarks/model_train.py [--seed 7] [--threads 1] [--twice] [--json OUT]
    .venv/bin/python benchmarks/model_train.py --finetune-only [--json OUT]

--finetune-only fine-tunes the shipped model (rules/models/core12*) on the episodes its metadata's
seed and size generate (their data hash checked against the metadata's) instead of training one,
and writes only its "finetune" figures to OUT, a file of its own (benchmarks/results/model_finetune.json):
a results file is written whole by one run, never merged into an earlier one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_results

from stethoscope.model import metadata
from stethoscope_training import dataset, episodes, evaluate, finetune
from stethoscope_training.train import TrainConfig, train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--twice", action="store_true", help="train a second time: reproducibility")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--finetune-only", action="store_true", help="fine-tune the shipped model only")
    args = parser.parse_args()
    if args.finetune_only:
        finetune_only(args)
        return
    figures: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        data = episodes.generate(seed=args.seed)
        figures["generate_s"] = round(time.perf_counter() - started, 2)
        config = TrainConfig(seed=args.seed, threads=args.threads)
        result = train(data, Path(scratch) / "a", "core12", data.data_hash(), config)
        test = result.meta.scores["test"]
        figures |= {
            "episodes": len(data),
            "train_s": round(result.seconds, 1),
            "threads": args.threads,
            "parity_max_abs_diff": result.parity,
            "test_macro_f1": test["macro_f1"],
            "test_fault_precision": {
                c: test["per_class"][c]["precision"] for c in list(test["per_class"])[1:]
            },
            "test_healthy_false_findings_percent": test["healthy_false_findings_percent"],
            "validation_rules_miss_recall": {
                k: v["recall"] for k, v in result.meta.scores["validation"]["rules_miss"].items()
            },
            "thresholds": result.meta.thresholds,
        }
        print(
            evaluate.render(
                test, f"test split, trained in {result.seconds:.1f} s on {args.threads} thread(s)"
            )
        )
        if args.twice:
            again = train(data, Path(scratch) / "b", "core12", data.data_hash(), config)
            figures["reproducible_macro_f1_diff"] = round(
                abs(again.meta.scores["test"]["macro_f1"] - test["macro_f1"]), 4
            )
        figures["finetune"] = finetuned(result.meta, data, args.seed, Path(scratch) / "ft")
    print(json.dumps(figures, indent=2))
    if args.json:
        write_results(args.json, figures, indent=2)


def finetuned(meta: metadata.ModelMeta, data: episodes.Episodes, seed: int, out: Path) -> dict:
    shifted = episodes.generate(seed=seed + 4, per_family=40, hw_class="shifted")
    tuned = finetune.finetune(meta, str(shifted.hw_class[0]), shifted, data, out)
    print(finetune.render(tuned, str(shifted.hw_class[0])))
    return {
        "seconds": round(tuned.seconds, 1),
        "new_before_accuracy": tuned.before["accuracy"],
        "new_after_accuracy": tuned.after["accuracy"],
        "old_before_accuracy": tuned.old_before["accuracy"],
        "old_after_accuracy": tuned.old_after["accuracy"],
    }


def finetune_only(args: argparse.Namespace) -> None:
    meta = metadata.load(metadata.metadata_path())
    with tempfile.TemporaryDirectory() as scratch:
        regenerated = dataset.regenerate(meta, Path(scratch) / "episodes")
        if regenerated.data_hash != meta.data_hash:
            print(
                "the shipped model's data hash is not what its seed generates now: retrain it first",
                file=sys.stderr,
            )
            raise SystemExit(2)  # a configuration error, not a failed run
        figures = finetuned(meta, regenerated.episodes, meta.seed, Path(scratch) / "ft")
    print(json.dumps(figures, indent=2))
    if args.json:
        write_results(args.json, {"finetune": figures}, indent=2)


if __name__ == "__main__":
    main()
