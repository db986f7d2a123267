"""The rules alone on labelled episodes (what `stethoscope model evaluate` prints beside the model):
each episode becomes one synthetic node in a scratch embedded database, the shipped rules diagnose
them all at the episodes' common end, and each node's most severe finding names a class: the one its
rule speaks for (diagnosis.model_findings.rule_class, as "model agrees" pairs them).

The episodes carry the model's 12 stream features and nothing else, so a rule that also reads
another metric (a counter's total, SMART, transmit discards) cannot fire here: the rules-alone
figures are what the rules make of the same signals the model sees."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.levels import SEVERITY_ORDER
from stethoscope.diagnosis.model_findings import rule_class
from stethoscope.diagnosis.rules import Rule
from stethoscope.model.metadata import CLASSES
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope_training.evaluate import RULES_MISS, class_scores

MAX_EPISODES = 400  # a bounded sample: every episode is 120 steps x 12 metrics of rows
END_MS = 1_798_761_600_000  # 2027-01-01T00:00Z: any fixed instant; all episodes end there


def sample(index: np.ndarray, limit: int = MAX_EPISODES, seed: int = 0) -> np.ndarray:
    if len(index) <= limit:
        return index
    return np.sort(np.random.default_rng(seed).choice(index, size=limit, replace=False))


def rules_predictions(
    episodes: Any, index: Sequence[int], rules: list[Rule], catalog: Catalog
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Per episode the class the rules name (0 when no rule fires), and the findings."""
    nodes = [f"episode{n:04d}" for n in range(len(index))]
    batch = MetricColumns()
    for node, i in zip(nodes, index, strict=True):
        batch.extend(MetricColumns.from_rows(episodes.to_rows(int(i), node, END_MS)))
    with (
        tempfile.TemporaryDirectory(prefix="stethoscope-rules-") as scratch,
        Store(f"chdb://{scratch}/db") as store,
    ):
        store.init_schema()
        store.insert_metrics(batch)
        findings = diagnose(store, rules, END_MS + 1, nodes=nodes)
    by_rule = {rule.rule_id: rule for rule in rules}
    worst: dict[str, tuple[int, int]] = {}
    for f in findings:
        rank = SEVERITY_ORDER[f["severity"]]
        if f["node_id"] not in worst or rank > worst[f["node_id"]][0]:
            worst[f["node_id"]] = (rank, CLASSES.index(rule_class(by_rule[f["rule_id"]], catalog)))
    pred = np.array([worst[n][1] if n in worst else 0 for n in nodes], dtype=int)
    return pred, findings


def rules_scores(episodes: Any, index: np.ndarray, rules: list[Rule], catalog: Catalog) -> dict[str, Any]:
    pred, _ = rules_predictions(episodes, list(index), rules, catalog)
    labels = episodes.label[index]
    scores = class_scores(labels, pred, CLASSES)
    healthy = labels == 0
    scores["healthy_false_findings_percent"] = round(
        100.0 * float(np.sum((pred != 0) & healthy)) / max(1, int(healthy.sum())), 3
    )
    misses = {}
    for family in RULES_MISS:
        members = np.array([str(f).startswith(family) for f in episodes.family[index]], dtype=bool)
        if members.any():
            misses[family] = {
                "episodes": int(members.sum()),
                "recall": round(float((pred == labels)[members].mean()), 4),
            }
    scores["rules_miss"] = misses
    return scores
