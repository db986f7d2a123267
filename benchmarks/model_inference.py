#!/usr/bin/env python3
"""The learned model's part of a diagnosis cycle for a fleet: features (one query
for all nodes, each rank's times from the same rows), normalisation, the classifier, the detector
(peer medians included), the explanation of the findings, and the job-relative layer (each job's
culprit rank, each switch's congestion, the graphs' findings on waiting peers folded), each timed.
Targets on the 2-core machine: all of it <= 2 s for 2,000 nodes in 250 jobs, the two graphs alone
<= 0.5 s. The first cycle of a process reads a cold store (ClickHouse's mark and uncompressed
caches, the arrays' first allocation); `serve` runs its cycles in one process, so the figures are
the median of the runs after the first, and the first run is reported beside them.

The store holds the last 10 minutes of the stream as the collector writes it: three fleets of
synchronous jobs side by side (stethoscope_training/jobs.py: 2,000 nodes behind 125 switches, 250
jobs of 8 ranks, node signals calibrated on the real H200 capture), one with a straggler rank, one
with a rank stalled on its input, one with a congested switch, so that the explanation and the
job-relative layer have findings to make.

    .venv/bin/python benchmarks/model_inference.py [--repeat 6] [--model JSON]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stethoscope import stats
from stethoscope.model import metadata
from stethoscope.model.decide import decide
from stethoscope.model.explain import explain_classes
from stethoscope.model.features import normalise, read_windows
from stethoscope.model.finding import ModelFinding
from stethoscope.model.findings import from_windows, read_topology
from stethoscope.model.inference import graphs_for
from stethoscope.model.relative import relative_findings
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms
from stethoscope_training.episodes import hardware
from stethoscope_training.jobs import Options, simulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import stamp, write_results

# (kind, switches of 16 nodes, the job ids' range): 672 + 672 + 656 nodes, 84 + 84 + 82 jobs of 8
FLEETS = (
    ("straggler", 42, (10_000, 20_000)),
    ("input_stall", 42, (20_000, 30_000)),
    ("switch_congestion", 41, (30_000, 40_000)),
)


def generate(store: Store, end_ms: int) -> tuple[int, list]:
    """-> (rows written, the fleets' scenes)."""
    _, _, hw = hardware("h200", 1)
    scenes = []
    for index, (kind, switches, ids) in enumerate(FLEETS):
        options = Options(
            switches=(switches, switches),
            per_switch=(16,),
            sizes=(8,),
            size_weights=(1.0,),
            idle=(0.0, 0.0),
            severity=(0.3, 0.3) if kind != "switch_congestion" else (0.0, 0.0),
            prefix=f"f{index}-",
            job_ids=ids,
        )
        scenes.append(simulate(np.random.default_rng(7 + index), hw, kind, f"bench.{kind}", options))
    written = 0
    detail = json.dumps({"gpu": {"models": ["NVIDIA H200"], "count": 8}})  # the sweep's class fingerprint
    for scene in scenes:
        rows = scene.to_rows(end_ms)
        for first in range(0, len(rows), 200_000):
            written += store.insert_metrics(MetricColumns.from_rows(rows[first : first + 200_000]))
        store.insert_rows("nodes", scene.nodes_rows(end_ms))
        store.insert_rows(
            "fingerprints",
            [
                {
                    "fingerprint": "h200x8",
                    "kind": "class",
                    "node_id": n,
                    "detail": detail,
                    "first_seen": end_ms,
                }
                for n in scene.node_ids
            ],
        )
    return written, scenes


def timed(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def one_run(store: Store, meta: metadata.ModelMeta, end_ms: int, scenes: list) -> dict:
    """The whole of it as `diagnose` runs it (read_windows, then findings.from_windows), timed as
    one; then each part again on its own, for the breakdown."""
    graphs = graphs_for(meta)
    windows, read_s = timed(read_windows, store, end_ms, features=tuple(meta.features))
    topology, topology_s = timed(read_topology, store, windows.node_ids)
    run, whole_s = timed(from_windows, graphs, windows, topology)
    x, normalise_s = timed(normalise, windows.x, windows.mask, meta, windows.hw_class)
    mask = np.ascontiguousarray(windows.mask, np.float32)
    probs, classify_s = timed(graphs.classify, x, mask)
    outliers, outlier_s = timed(graphs.outlier, x, mask, windows.hw_class, windows.job)
    decided = decide(probs, meta.thresholds, meta.classes)
    graph_findings = [
        ModelFinding(
            f"model.{meta.classes[int(decided[r])]}",
            windows.node_ids[r],
            meta.classes[int(decided[r])],
            1.0,
            1.0,
            0.5,
            {},
        )
        for r in range(len(probs))
        if decided[r]
    ]
    rows = np.arange(len(windows.node_ids))
    view, relative_s = timed(relative_findings, meta, windows, rows, x, mask, graph_findings, topology)
    index = {node: i for i, node in enumerate(windows.node_ids)}
    targets = [(index[f.node_id], meta.classes.index(f.layer)) for f in view.explain]
    names = [f.metric for f in meta.features]
    _, explain_s = timed(explain_classes, graphs, x, mask, targets, probs, names)
    truth = []
    for scene in scenes:
        t = scene.truth
        truth.append(
            f"switch {t['switch']}" if "switch" in t else f"job {t['job']} rank {t['rank']} ({t['kind']})"
        )
    said = [
        f.detail.split(":")[0] + (f" rank {', '.join(f.ranks)}" if f.ranks else "")
        for f in run.findings
        if f.detail
    ]
    return {
        "features_read_s": read_s,
        "topology_s": topology_s,
        "after_read_in_one_call_s": whole_s,
        "total_s": read_s + topology_s + whole_s,
        # the parts of after_read_in_one_call_s, each again on its own
        "normalise_s": normalise_s,
        "classifier_s": classify_s,
        "detector_s": outlier_s,
        "job_relative_s": relative_s,
        "explanation_s": explain_s,
        "inference_s": classify_s + outlier_s,
        "nodes": len(windows.node_ids),
        "ranks": len(windows.ranks),
        "jobs": len(set(windows.ranks.job)),
        "graph_findings": len(graph_findings),
        "explained_findings": len(targets),
        "findings": len(run.findings),
        "findings_by_rule": {
            r: sum(f.rule_id == r for f in run.findings) for r in sorted({f.rule_id for f in run.findings})
        },
        "culprits_injected": truth,
        "job_and_switch_findings": said,
        "scored_by_peers": int(outliers.scored.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=6, help="runs, the first of them cold (at least 2)")
    parser.add_argument("--model", type=Path, default=metadata.metadata_path())
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "model_inference.json"
    )
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error("--repeat: at least 2 (the first run is cold and reported apart)")
    meta = metadata.load(args.model)
    provenance = stamp()
    end_ms = now_ms() - 1000
    with (
        tempfile.TemporaryDirectory(prefix="stethoscope-bench-") as folder,
        Store(f"chdb://{folder}/db") as store,
    ):
        store.init_schema()
        (rows, scenes), generate_s = timed(generate, store, end_ms)
        graphs_for(meta)  # loading the sessions is once per process, not per cycle
        runs = [one_run(store, meta, end_ms, scenes) for _ in range(args.repeat)]
    warm = runs[1:]
    median = {key: round(stats.median([r[key] for r in warm]), 4) for key in runs[0] if key.endswith("_s")}
    first = {key: round(runs[0][key], 4) for key in runs[0] if key.endswith("_s")}
    last = runs[-1]
    report = {
        "target": "2,000 nodes in 250 jobs: features + both graphs + explanation + job-relative layer "
        "(total_s: the read, the topology and findings.from_windows as diagnose runs them) <= 2 s, "
        "inference alone <= 0.5 s",
        "model": f"{meta.name} ({args.model})",
        "nodes": last["nodes"],
        "ranks": last["ranks"],
        "jobs": last["jobs"],
        "rows": rows,
        "generate_seconds": round(generate_s, 1),
        "median_seconds": median,
        "median_of": f"runs 2-{len(runs)} (a serve process's cycles after its first)",
        "first_run_seconds": first,
        "findings": last["findings"],
        "findings_by_rule": last["findings_by_rule"],
        "culprits_injected": last["culprits_injected"],
        "job_and_switch_findings": last["job_and_switch_findings"],
        "graph_findings": last["graph_findings"],
        "explained_findings": last["explained_findings"],
        "scored_by_peers": last["scored_by_peers"],
        "runs": [
            {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items() if k.endswith("_s")}
            for r in runs
        ],
    }
    print(f"{'':<28}{'median':>8}  {'first run':>9}")
    for key, value in median.items():
        print(f"{key:<28}{value:8.3f}  {first[key]:9.3f} s")
    print(
        f"{report['nodes']} nodes, {report['ranks']} ranks in {report['jobs']} jobs; findings "
        f"{report['findings']} ({report['findings_by_rule']}), explained {report['explained_findings']}; "
        f"injected {report['culprits_injected']}, said {report['job_and_switch_findings']}"
    )
    write_results(args.out, report, provenance)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
