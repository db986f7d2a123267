"""Findings of the shipped model (docs/design.md "Learned diagnosis"): the 12 features of every node
from one query, normalised, through the classifier and the detector in one batch each; the most
probable class, when a fault class over its threshold (from the metadata, chosen on validation data;
the decision the held-out scores measure), or an outlier score over its threshold is a finding,
explained (occlusion, one run for all findings) and placed on the topology (fault path).

model.outlier's layer is the layer of its largest deviation's feature; its confidence maps the
score onto 0..1 as score / (score + threshold): 0.5 at the threshold, towards 1 far beyond it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stethoscope.model.decide import decide
from stethoscope.model.explain import explain_classes, explain_outlier
from stethoscope.model.finding import STOPPED, SWEPT, SWITCH_RULE, UNKNOWN_CLASS, ModelFinding
from stethoscope.model.inference import Graphs, graphs_for
from stethoscope.model.metadata import ModelMeta, load, metadata_path
from stethoscope.model.path import Place, fault_paths
from stethoscope.model.relative import relative_findings
from stethoscope.store.client import Store

PREFIX = "model."


@dataclass
class ModelRun:
    findings: list[ModelFinding] = field(default_factory=list)
    # nodes the model judged (data, a stream, a class it knows): their silent findings resolve, and
    # the findings of a node it saw but could not judge go stale, not resolved
    evaluated: list[str] = field(default_factory=list)
    # why nodes were not classified (only swept, or a GPU class it has no normalisation for: a healthy
    # A100 read with an H200's statistics looks faulty, until `model finetune --class`) -> the nodes
    unjudged: dict[str, list[str]] = field(default_factory=dict)
    # the switches judged for congestion (MIN_NODES busy nodes behind them): a congested switch's
    # finding resolves once it is judged and clear
    switches: list[str] = field(default_factory=list)


def model_findings(
    store: Store, at_ms: int, nodes: Sequence[str] | None = None, meta: ModelMeta | None = None
) -> list[ModelFinding]:
    """-> list[ModelFinding] at `at_ms` (of `nodes` only, when given). Raises ModelError when the
    model's files are missing or damaged."""
    return run_model(store, at_ms, nodes, meta).findings


def run_model(
    store: Store, at_ms: int, nodes: Sequence[str] | None = None, meta: ModelMeta | None = None
) -> ModelRun:
    from stethoscope.model.features import read_windows

    meta = meta or load(metadata_path())
    graphs = graphs_for(meta)
    windows = read_windows(
        store, at_ms, nodes=None if nodes is None else list(nodes), features=tuple(graphs.meta.features)
    )
    return from_windows(graphs, windows, read_topology(store, windows.node_ids))


def from_windows(graphs: Graphs, windows: Any, topology: dict[str, Place], relative: bool = True) -> ModelRun:
    """The findings of windows already read (features.Windows). `relative`: with the job-relative
    detector and the congested switches, which fold the graphs' findings on nodes that only wait
    (relative.py); without it, the graphs' node findings alone (evaluation compares the two)."""
    from stethoscope.model.features import normalise

    meta = graphs.meta
    names = [f.metric for f in meta.features]
    if not windows.node_ids:  # nothing stored in the window yet
        return ModelRun()
    has_data = windows.mask.reshape(len(windows.node_ids), -1).max(axis=1, initial=0.0) > 0
    rows = np.flatnonzero(has_data)
    run = ModelRun(evaluated=[windows.node_ids[i] for i in rows])
    if not len(rows):
        return run
    x = normalise(windows.x[rows], windows.mask[rows], meta, [windows.hw_class[i] for i in rows])
    mask = np.ascontiguousarray(windows.mask[rows], np.float32)
    node_ids = list(run.evaluated)
    probs = graphs.classify(x, mask)
    outliers = graphs.outlier(x, mask, [windows.hw_class[i] for i in rows], [windows.job[i] for i in rows])

    classes = [windows.hw_class[i] for i in rows]
    # a node of no known class (no class fingerprint yet) may be any GPU: not judged either; nor a node
    # only swept: the shipped model learned stream windows, and resampled sweeps read otherwise to it
    streamed = [windows.streamed[i] for i in rows] if windows.streamed else [True] * len(rows)
    current = [windows.current[i] for i in rows] if windows.current else streamed
    judged = []
    for node, hw, s, now in zip(node_ids, classes, streamed, current, strict=True):
        if not s:
            why = SWEPT
        elif not now:  # its agent stopped: UNKNOWN speaks for it, not minutes-old samples
            why = STOPPED
        elif hw not in meta.normalisation:
            why = hw or UNKNOWN_CLASS
        else:
            why = None
        if why is not None:
            run.unjudged.setdefault(why, []).append(node)
        judged.append(why is None)
    run.evaluated = [node for node, ok in zip(node_ids, judged, strict=True) if ok]
    # the decision the held-out scores were measured with: the most probable class, if a fault class
    # whose probability reaches its threshold (never two classes for one node)
    decided = decide(probs, meta.thresholds, meta.classes)
    targets = {}  # each class finding -> (row, class index), explained once it is known to be shown
    found: list[ModelFinding] = []
    for row in range(len(rows)):
        if judged[row] and decided[row]:
            index = int(decided[row])
            name = meta.classes[index]
            probability = float(probs[row, index])
            f = ModelFinding(
                PREFIX + name, node_ids[row], name, probability, probability, meta.thresholds[name], {}
            )
            targets[id(f)] = (row, index)
            found.append(f)
    limit = meta.thresholds["outlier"]
    gone = set(run.unjudged.get(STOPPED, ()))  # their agents stopped: no outlier on old samples either
    stopped = np.array([node in gone for node in node_ids], dtype=bool)
    over = outliers.scored & ~stopped & (np.nan_to_num(outliers.score, nan=-1.0) >= limit)
    for row in (int(r) for r in np.flatnonzero(over)):
        score = float(outliers.score[row])
        layer = meta.features[int(np.argmax(outliers.deviation[row]))].layer
        confidence = score / (score + limit) if score + limit > 0 else 1.0
        explanation = explain_outlier(outliers.deviation[row], names)
        found.append(
            ModelFinding(PREFIX + "outlier", node_ids[row], layer, confidence, score, limit, explanation)
        )

    for layer in sorted({f.layer for f in found}):  # a path spans nodes with an anomaly of one layer
        same = [f for f in found if f.layer == layer]
        scores: dict[str, float] = {}
        for f in same:
            scores[f.node_id] = max(scores.get(f.node_id, 0.0), f.confidence)
        paths = fault_paths(scores, topology)
        for f in same:
            f.path = paths[f.node_id]
    shown = [f for f in found if id(f) in targets]
    if relative:
        judged_rows = np.array([r for r in range(len(rows)) if judged[r]], dtype=int)
        view = relative_findings(
            meta, windows, rows[judged_rows], x[judged_rows], mask[judged_rows], found, topology
        )
        found = view.findings
        run.switches = view.switches
        shown = [f for f in view.explain if id(f) in targets]
    # occlusion for the class findings shown only (a folded peer's finding is not explained)
    wanted = [targets[id(f)] for f in shown]
    for f, explanation in zip(shown, explain_classes(graphs, x, mask, wanted, probs, names), strict=True):
        f.explanation.update(explanation)
    class_of = {windows.node_ids[i]: windows.hw_class[i] for i in rows}
    for f in found:
        f.model, f.model_version = meta.name, graphs.version
        if f.rule_id != SWITCH_RULE:
            f.calibration = meta.calibrated(class_of.get(f.node_id, ""))
    run.findings = sorted(found, key=lambda f: (f.node_id, f.rule_id))
    return run


def read_topology(store: Store, nodes: Sequence[str] | None = None) -> dict[str, Place]:
    """The latest rack and switch of each node in the `nodes` table (of `nodes` only, when given)."""
    where, params = "", {}
    if nodes is not None:
        where, params = "WHERE node_id IN {nodes:Array(String)} ", {"nodes": sorted(nodes)}
    rows = store.query(
        "SELECT node_id, argMax(rack, updated_at), argMax(switch, updated_at) "
        f"FROM {store.database}.nodes {where}GROUP BY node_id",
        params,
    )
    return {row[0]: Place(row[1], row[2]) for row in rows}
