#!/usr/bin/env python3
"""The shipped model (rules/models/core12*) on episodes generated afresh from the seed in its
metadata, beside the rules alone on a sample of the same episodes: per-class precision, recall, F1,
macro-F1, healthy false findings, the rules-miss families, and inference time per episode batch.
Targets: macro-F1 >= 0.90, fault precision >= 0.92, healthy false findings <= 1 %.

    .venv/bin/python benchmarks/model_scores.py [--rules-sample 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from provenance import write_results

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.rules import load_rules
from stethoscope.model.metadata import load, metadata_path
from stethoscope.paths import project_root
from stethoscope_training import dataset, evaluate
from stethoscope_training.rules_alone import rules_scores, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rules-sample", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    meta = load(metadata_path())
    with tempfile.TemporaryDirectory() as scratch:
        data = dataset.regenerate(meta, Path(scratch))
    eps = data.episodes
    started = time.perf_counter()
    model = evaluate.evaluate(meta, eps, "test")
    seconds = time.perf_counter() - started
    print(evaluate.render(model, f"model {meta.name}, test split ({seconds:.2f} s incl. loading)"))
    catalog = Catalog.load()
    rules = load_rules(project_root() / "rules", catalog).rules
    test = sample(np.flatnonzero(eps.split == "test"), args.rules_sample)
    started = time.perf_counter()
    by_rules = rules_scores(eps, test, rules, catalog)
    miss = rules_scores(eps, sample(evaluate.rules_miss_index(eps, "test"), 100), rules, catalog)
    by_rules["rules_miss"], by_rules["rules_miss_split"] = miss["rules_miss"], "validation"
    rules_seconds = time.perf_counter() - started
    print(evaluate.render(by_rules, f"rules alone on {len(test)} of them ({rules_seconds:.1f} s)"))
    keys = ("macro_f1", "accuracy", "healthy_false_findings_percent", "rules_miss")
    figures = {
        "data_hash_matches": data.data_hash == meta.data_hash,
        "model": {k: model[k] for k in keys},
        "model_fault_precision": {c: v["precision"] for c, v in list(model["per_class"].items())[1:]},
        "model_outlier": model["outlier"],
        "model_evaluate_s": round(seconds, 2),
        "rules": {k: by_rules[k] for k in keys},
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        write_results(args.json, figures, indent=2)


if __name__ == "__main__":
    main()
