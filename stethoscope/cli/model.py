"""`stethoscope model train|evaluate|finetune|info`: the learned diagnosis's model files
(docs/design.md "Learned diagnosis (ONNX)"). train, evaluate and finetune import the training
package (`stethoscope_training`, the aicluster-stethoscope-training distribution, which brings torch)
lazily; info needs the runtime alone."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from stethoscope.cli.common import Subcommands, checked_rules, said_as
from stethoscope.cli.exit_codes import EXIT_OK
from stethoscope.model.metadata import DEFAULT_NAME, ModelError, ModelMeta, load, metadata_path, models_dir
from stethoscope.paths import own_models_dir
from stethoscope.timeutil import days_option


def register(commands: Subcommands, parents: list[argparse.ArgumentParser]) -> None:
    model = commands.add_parser(
        "model", help="the learned diagnosis: train, evaluate, finetune, info", parents=parents
    )
    sub = model.add_subparsers(dest="model_command", required=True)

    train = sub.add_parser(
        "train", help="train on episodes, export both ONNX graphs and the metadata", parents=parents
    )
    train.set_defaults(func=run_train)
    train.add_argument("--episodes", type=Path, help="episode folder (default: generate with the defaults)")
    train.add_argument("--seed", type=int, default=7, help="training and generation seed (default 7)")
    train.add_argument("--name", default=DEFAULT_NAME, help=f"model name (default {DEFAULT_NAME})")
    train.add_argument("--out", type=Path, help="folder for the model (default rules/models)")
    train.add_argument("--per-family", type=int, help="episodes per family when generating")

    evaluate = sub.add_parser(
        "evaluate", help="per-class scores on held-out episodes, beside the rules", parents=parents
    )
    evaluate.set_defaults(func=run_evaluate)
    _model_option(evaluate)
    evaluate.add_argument(
        "--episodes", type=Path, help="episode folder (default: regenerated from the model's seed)"
    )
    evaluate.add_argument("--split", default="test", help="which split to score (default test)")
    evaluate.add_argument("--no-rules", action="store_true", help="skip the rules-alone comparison")
    evaluate.add_argument("--json", action="store_true", help="print the scores as JSON")
    evaluate.add_argument(
        "--job-scenes",
        type=int,
        default=5,
        help="scenes per family of synchronous jobs over a fleet (the held-out job set): the graphs, "
        "the job-relative detector and both, side by side (default 5; 0 skips them)",
    )

    finetune = sub.add_parser(
        "finetune",
        help="adapt the last two dense layers to a new hardware class, or to the store's own faults",
        parents=parents,
    )
    finetune.set_defaults(func=run_finetune)
    _model_option(finetune)
    finetune.add_argument("--class", dest="hw_class", help="the new hardware class (with --episodes)")
    finetune.add_argument("--episodes", type=Path, help="its episodes (tools/lab.py episodes)")
    finetune.add_argument("--faults", type=int, default=10, help="fault episodes to tune on (default 10)")
    finetune.add_argument(
        "--from-faults",
        action="store_true",
        help="the store instead: calibrate the GPU classes the model lacks on their healthy windows, "
        "and tune on the windows of the recorded faults (`fault confirm`)",
    )
    finetune.add_argument(
        "--days",
        type=days_option,
        default=1,
        help="with --from-faults: how far back healthy windows go, in days or a duration: 1, 36h (1)",
    )
    finetune.add_argument(
        "--min-faults", type=int, default=10, help="with --from-faults: faults needed to tune the heads (10)"
    )
    finetune.add_argument(
        "--out",
        type=Path,
        help="write the tuned model here (default: the state folder's models/, which diagnose, watch "
        "and serve read before the shipped model)",
    )

    info = sub.add_parser(
        "info", help="features, classes, thresholds, scores, data and history", parents=parents
    )
    info.set_defaults(func=run_info)
    _model_option(info)
    info.add_argument("--json", action="store_true", help="print the metadata as JSON")


def _model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=DEFAULT_NAME,
        help=f"a name (the state folder's models/ first, then the shipped rules/models) or a .json file "
        f"(default {DEFAULT_NAME})",
    )


def training(module: str) -> Any:
    """A module of the training package, or a configuration error (exit 2) saying how to get it."""
    import importlib

    try:
        return importlib.import_module(f"stethoscope_training.{module}")
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("stethoscope_training"):
            raise
        raise ModelError(
            "the training package (stethoscope_training) is not installed: "
            "pip install aicluster-stethoscope-training (from a checkout: pip install ./training)"
        ) from None


def model_meta(named: str) -> ModelMeta:
    path = Path(named)
    return load(path if path.suffix == ".json" else metadata_path(named))


def _episodes(directory: Path | None, scratch: str, seed: int, per_family: int | None = None) -> Any:
    dataset = training("dataset")
    if directory is not None:
        if not directory.is_dir():
            raise ModelError(f"--episodes {directory}: no such folder")
        return dataset.load_dir(directory)
    print(f"generating episodes (seed {seed}) into {scratch}", file=sys.stderr)
    return dataset.generate_dir(Path(scratch), seed, per_family)


@said_as("model train", (ModelError,))
def run_train(args: argparse.Namespace) -> int:
    evaluate = training("evaluate")
    trainer = training("train")
    trainer.require_torch()  # before minutes of generation
    with tempfile.TemporaryDirectory(prefix="stethoscope-episodes-") as scratch:
        data = _episodes(args.episodes, scratch, args.seed, args.per_family)
        result = trainer.train(
            data.episodes,
            args.out or models_dir(),
            args.name,
            data.data_hash,
            trainer.TrainConfig(seed=args.seed),
        )
    counts = data.manifest.get("per_family") or {}
    if counts:  # so that `model evaluate` and the tests can generate the same episodes again
        result.meta.history[-1]["per_family"] = max(counts.values())
        result.meta.history[-1]["generator_version"] = data.manifest.get("generator_version")
        result.meta.save(result.meta.path)  # type: ignore[arg-type]
    print(f"trained {args.name} in {result.seconds:.1f} s (export parity {result.parity:.1e})")
    print(evaluate.render(result.meta.scores["test"], "test (held-out families, replayed healthy)"))
    print(f"thresholds: {json.dumps(result.meta.thresholds)}")
    print(f"wrote {result.meta.path} and its graphs")
    return EXIT_OK


@said_as("model evaluate", (ModelError,))
def run_evaluate(args: argparse.Namespace) -> int:
    import numpy as np

    evaluate = training("evaluate")
    meta = model_meta(args.model)
    with tempfile.TemporaryDirectory(prefix="stethoscope-episodes-") as scratch:
        if args.episodes is None:
            print(f"regenerating the model's episodes (seed {meta.seed}) into {scratch}", file=sys.stderr)
            data = training("dataset").regenerate(meta, Path(scratch))
            if meta.data_hash and data.data_hash and data.data_hash != meta.data_hash:
                print(
                    "stethoscope: model evaluate: warning: the regenerated episodes' hash differs from "
                    "the model's data_hash (another generator version)",
                    file=sys.stderr,
                )
        else:
            data = _episodes(args.episodes, scratch, meta.seed)
        scores: dict[str, Any] = {"model": evaluate.evaluate(meta, data.episodes, args.split)}
        if not args.no_rules:
            episodes = data.episodes
            scores["rules"] = _rules_alone(episodes, np.flatnonzero(episodes.split == args.split), 300)
            if scores["model"].get("rules_miss_split"):
                miss = _rules_alone(episodes, evaluate.rules_miss_index(episodes, args.split), 100)
                scores["rules"]["rules_miss"] = miss["rules_miss"]
                scores["rules"]["rules_miss_split"] = "validation"
    if args.job_scenes > 0:
        scores["jobs"] = _job_scenes(meta, args.job_scenes)
    if args.json:
        print(json.dumps(scores, indent=2))
        return EXIT_OK
    print(evaluate.render(scores["model"], f"model {meta.name} on the {args.split} split"))
    if "rules" in scores:
        print(evaluate.render(scores["rules"], f"rules alone on {scores['rules']['episodes']} of them"))
    if "jobs" in scores:
        title = f"job scenes (held-out set {scores['jobs']['set']}, seed {meta.seed})"
        print(training("job_evaluate").render(scores["jobs"], title))
    return EXIT_OK


def _job_scenes(meta: ModelMeta, per_family: int) -> dict[str, Any]:
    from stethoscope.model.inference import graphs_for

    job_evaluate, job_fresh = training("job_evaluate"), training("job_fresh")
    scenes = job_fresh.scenes(seed=meta.seed, per_family=per_family)
    results = job_evaluate.evaluate_scenes(graphs_for(meta), scenes.scenes)
    return {**job_evaluate.scores(results), "set": job_fresh.SET, "per_family": per_family}


def _rules_alone(episodes: Any, index: Any, limit: int) -> dict[str, Any]:
    from stethoscope.catalog import Catalog

    alone = training("rules_alone")
    catalog = Catalog.load()
    rules = checked_rules(None, catalog, "model evaluate").rules
    return alone.rules_scores(episodes, alone.sample(index, limit), rules, catalog)


@said_as("model finetune", (ModelError,))
def run_finetune(args: argparse.Namespace) -> int:
    if args.from_faults:
        return _finetune_from_faults(args)
    if not args.hw_class or args.episodes is None:
        raise ModelError("finetune: give --class and --episodes, or --from-faults")
    finetune = training("finetune")
    dataset = training("dataset")
    training("train").require_torch()
    if args.faults < 1:
        raise ModelError(f"--faults {args.faults}: must be 1 or more")
    meta = model_meta(args.model)
    if not args.episodes.is_dir():
        raise ModelError(f"--episodes {args.episodes}: no such folder")
    new = dataset.load_dir(args.episodes)
    if args.hw_class not in set(new.episodes.hw_class.tolist()):
        raise ModelError(f"--episodes {args.episodes}: no episodes of hardware class {args.hw_class!r}")
    with tempfile.TemporaryDirectory(prefix="stethoscope-episodes-") as scratch:
        old = dataset.regenerate(meta, Path(scratch))
        out = args.out or own_models_dir()
        result = finetune.finetune(meta, args.hw_class, new.episodes, old.episodes, out, args.faults)
    print(finetune.render(result, args.hw_class))
    return EXIT_OK


def _finetune_from_faults(args: argparse.Namespace) -> int:
    from stethoscope.store.client import Store

    from_store = training("from_store")
    if args.min_faults < 1:
        raise ModelError("finetune --from-faults: --min-faults must be 1 or more")
    meta = model_meta(args.model)
    with Store(args.dsn, args.database) as store:
        store.ensure_schema()
        if len(from_store.list_faults(store)) >= args.min_faults:
            training("train").require_torch()  # tuning the heads will need it: say so before reading
        out = args.out or own_models_dir()
        result = from_store.finetune_from_faults(meta, store, out, args.days, args.min_faults)
    print(from_store.render(result))
    return EXIT_OK


@said_as("model info", (ModelError,))
def run_info(args: argparse.Namespace) -> int:
    meta = model_meta(args.model)
    if args.json:
        print(meta.to_json(), end="")
        return EXIT_OK
    print(f"model {meta.name} ({meta.path}): data {meta.data}, seed {meta.seed}, hash {meta.data_hash[:16]}")
    print(f"  graphs: {', '.join(f'{k} {v}' for k, v in meta.graphs.items())}")
    print(f"  window: {meta.steps} steps x {meta.step_seconds} s; classes: {', '.join(meta.classes)}")
    print("  features:")
    for f in meta.features:
        print(f"    {f.metric} ({f.agg}, {f.transform}, {f.layer}): {f.why}")
    print(f"  normalisation: {', '.join(meta.normalisation)}")
    print(f"  thresholds: {', '.join(f'{k} {v:g}' for k, v in meta.thresholds.items())}")
    for split, s in meta.scores.items():
        if s:
            per = ", ".join(
                f"{c} P {v['precision']:.3f} R {v['recall']:.3f}" for c, v in s["per_class"].items()
            )
            print(
                f"  {split}: macro-F1 {s['macro_f1']:.3f}; {per}; "
                f"healthy false findings {s.get('healthy_false_findings_percent', 0):.2f} %"
            )
    print("  history:")
    for h in meta.history:
        extra = f" {h['hw_class']}" if "hw_class" in h else ""
        made = f", generator version {h['generator_version']}" if "generator_version" in h else ""
        print(
            f"    {h.get('at', '')} {h.get('action', '')}{extra}: test macro-F1 {h.get('test_macro_f1')}, "
            f"{h.get('episodes')} episodes, {h.get('seconds')} s{made}"
        )
    return EXIT_OK
