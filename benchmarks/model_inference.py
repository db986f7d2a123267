#!/usr/bin/env python3
"""The learned model's part of a diagnosis cycle for a fleet (issue 10): features (one query for all
nodes), normalisation, the classifier, the detector (peer medians included) and the explanation of
the findings, each timed. Targets on the 2-core machine: all of it <= 2 s for 2,000 nodes, the two
graphs alone <= 0.5 s. The first cycle of a process reads a cold store (ClickHouse's mark and
uncompressed caches, the arrays' first allocation); `serve` runs its cycles in one process, so the
figures are the median of the runs after the first, and the first run is reported beside them.

The store holds the last 10 minutes of the 12 features as the stream collector writes them
(Episodes.to_rows, calibrated on the real H200 capture): one job per 16 nodes whose ranks replay one
healthy episode in lockstep, and every 50th node a fault episode (RDMA drops, an AllReduce centre, a
slow NVMe with clean SMART, a straggler GPU), so that the explanation has findings to explain.

    .venv/bin/python benchmarks/model_inference.py [--nodes 2000] [--repeat 6] [--model JSON]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from stethoscope import stats
from stethoscope.model import episodes, metadata
from stethoscope.model.explain import explain_classes
from stethoscope.model.features import normalise, read_windows
from stethoscope.model.findings import from_windows, read_topology
from stethoscope.model.inference import graphs_for
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

JOB_SIZE = 16  # a job's ranks run in lockstep: one healthy episode per job
FAULT_EVERY = 50  # every 50th node replays a fault episode instead (2 %)
FAULTS = (
    "communication.rdma_drop_storm",
    "communication.allreduce_centre",
    "storage.slow_nvme_clean_smart",
    "compute.straggler_gpu",
)


def generate(store: Store, nodes: int, end_ms: int) -> int:
    """Stream rows as the collector writes them (Episodes.to_rows: device "node"/"job", labels
    source=stream), from the episodes calibrated on the real H200 capture."""
    data = episodes.generate(7, max(8, nodes // JOB_SIZE + 1))
    healthy = np.flatnonzero(data.family == "healthy.training")
    faulty = {name: np.flatnonzero(data.family == name) for name in FAULTS}
    written = 0
    for first in range(0, nodes, 200):
        batch = MetricColumns()
        for n in range(first, min(first + 200, nodes)):
            node, job = f"node{n:04d}", n // JOB_SIZE
            if n % FAULT_EVERY == 7:
                family = FAULTS[(n // FAULT_EVERY) % len(FAULTS)]
                index = int(faulty[family][n % len(faulty[family])])
            else:
                index = int(healthy[job % len(healthy)])
            for row in data.to_rows(index, node, end_ms):
                labels = dict(row["labels"], job=f"job{job}") if "job" in row["labels"] else row["labels"]
                batch.append(node, row["metric_name"], row["device"], labels, row["value"], row["timestamp"])
        written += store.insert_metrics(batch)
    store.insert_rows(
        "nodes",
        [
            {
                "node_id": f"node{i:04d}",
                "slurm_name": f"node{i:04d}",
                "rack": f"rack{i // 32}",
                "switch": f"leaf{i // 16}",
                "groups": [],
                "updated_at": end_ms,
            }
            for i in range(nodes)
        ],
    )
    detail = json.dumps({"gpu": {"models": ["NVIDIA H200"], "count": 8}})  # the sweep's class fingerprint
    store.insert_rows(
        "fingerprints",
        [
            {
                "fingerprint": "h200x8",
                "kind": "class",
                "node_id": f"node{i:04d}",
                "detail": detail,
                "first_seen": end_ms,
            }
            for i in range(nodes)
        ],
    )
    return written


def timed(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def one_run(store: Store, meta: metadata.ModelMeta, end_ms: int) -> dict:
    graphs = graphs_for(meta)
    windows, read_s = timed(read_windows, store, end_ms, features=tuple(meta.features))
    x, normalise_s = timed(normalise, windows.x, windows.mask, meta, windows.hw_class)
    mask = np.ascontiguousarray(windows.mask, np.float32)
    probs, classify_s = timed(graphs.classify, x, mask)
    outliers, outlier_s = timed(graphs.outlier, x, mask, windows.hw_class, windows.job)
    targets = [
        (row, index)
        for row in range(len(probs))
        for index, name in enumerate(meta.classes)
        if index and probs[row, index] >= meta.thresholds[name]
    ]
    names = [f.metric for f in meta.features]
    _, explain_s = timed(explain_classes, graphs, x, mask, targets, probs, names)
    topology, topology_s = timed(read_topology, store, windows.node_ids)
    run, whole_s = timed(from_windows, graphs, windows, topology)  # everything after the read, again
    return {
        "features_read_s": read_s,
        "normalise_s": normalise_s,
        "classifier_s": classify_s,
        "detector_s": outlier_s,
        "explanation_s": explain_s,
        "topology_s": topology_s,
        "inference_s": classify_s + outlier_s,
        "total_s": read_s + normalise_s + classify_s + outlier_s + explain_s + topology_s,
        "after_read_in_one_call_s": whole_s,
        "nodes": len(windows.node_ids),
        "explained_findings": len(targets),
        "findings": len(run.findings),
        "findings_on_faulted_nodes": sum(int(f.node_id[4:]) % FAULT_EVERY == 7 for f in run.findings),
        "findings_by_rule": {
            r: sum(f.rule_id == r for f in run.findings) for r in sorted({f.rule_id for f in run.findings})
        },
        "scored_by_peers": int(outliers.scored.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=6, help="runs, the first of them cold (at least 2)")
    parser.add_argument("--model", type=Path, default=metadata.metadata_path())
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "model_inference.json"
    )
    args = parser.parse_args()
    if args.repeat < 2:
        parser.error("--repeat: at least 2 (the first run is cold and reported apart)")
    meta = metadata.load(args.model)
    end_ms = now_ms() - 1000
    with (
        tempfile.TemporaryDirectory(prefix="stethoscope-bench-") as folder,
        Store(f"chdb://{folder}/db") as store,
    ):
        store.init_schema()
        rows, generate_s = timed(generate, store, args.nodes, end_ms)
        graphs_for(meta)  # loading the sessions is once per process, not per cycle
        runs = [one_run(store, meta, end_ms) for _ in range(args.repeat)]
    warm = runs[1:]
    median = {key: round(stats.median([r[key] for r in warm]), 4) for key in runs[0] if key.endswith("_s")}
    first = {key: round(runs[0][key], 4) for key in runs[0] if key.endswith("_s")}
    report = {
        "target": "2,000 nodes: features + both graphs + explanation <= 2 s, inference alone <= 0.5 s",
        "model": f"{meta.name} ({args.model})",
        "nodes": args.nodes,
        "rows": rows,
        "generate_seconds": round(generate_s, 1),
        "median_seconds": median,
        "median_of": f"runs 2-{len(runs)} (a serve process's cycles after its first)",
        "first_run_seconds": first,
        "findings": runs[-1]["findings"],
        "findings_on_faulted_nodes": runs[-1]["findings_on_faulted_nodes"],
        "findings_by_rule": runs[-1]["findings_by_rule"],
        "explained_findings": runs[-1]["explained_findings"],
        "scored_by_peers": runs[-1]["scored_by_peers"],
        "runs": [{k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()} for r in runs],
    }
    print(f"{'':<28}{'median':>8}  {'first run':>9}")
    for key, value in median.items():
        print(f"{key:<28}{value:8.3f}  {first[key]:9.3f} s")
    print(
        f"findings {report['findings']} ({report['findings_on_faulted_nodes']} on the "
        f"{report['nodes'] // FAULT_EVERY} faulted nodes; {report['findings_by_rule']}), "
        f"explained {report['explained_findings']}, "
        f"peers scored {report['scored_by_peers']}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
