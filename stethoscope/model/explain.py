"""Why the model said it (docs/design.md "Learned diagnosis"): per finding, each metric's share in
percent. Classifier findings by occlusion through onnxruntime: each feature in turn replaced by its
healthy mean (0 in normalised space; the mask is kept, so a gap stays a gap), the drop in the class's
probability, negative drops counted as 0, shares normalised to 100. Every occlusion of every finding
goes in one classifier run. Outlier findings: the detector's own per-feature deviation.

Where no feature's occlusion lowers the probability (the class rests on all of them at once), the
shares fall back to each feature's distance from its healthy mean (mean |x| over observed steps),
so an explanation always sums to 100."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stethoscope.model.inference import Graphs

DECIMALS = 1


def occlusion_drops(
    graphs: Graphs,
    x_norm: np.ndarray,
    mask: np.ndarray,
    targets: Sequence[tuple[int, int]],
    probs: np.ndarray,
) -> np.ndarray:
    """targets: (row, class index) per finding; probs: the classifier's output for every row.
    -> [len(targets), F] the drop in the target class's probability per occluded feature."""
    features = x_norm.shape[2]
    if not targets:
        return np.zeros((0, features), np.float32)
    rows = np.array([row for row, _ in targets])
    classes = np.array([cls for _, cls in targets])
    batch = np.repeat(x_norm[rows], features, axis=0)  # [T*F, steps, F]: finding-major
    batch = batch.reshape(len(rows), features, *x_norm.shape[1:])
    batch[:, np.arange(features), :, np.arange(features)] = 0.0  # copy f loses feature f
    occluded = graphs.classify(batch.reshape(-1, *x_norm.shape[1:]), np.repeat(mask[rows], features, axis=0))
    occluded = occluded.reshape(len(rows), features, -1)[np.arange(len(rows)), :, classes]
    return probs[rows, classes][:, None] - occluded


def shares(weights: np.ndarray, names: Sequence[str], fallback: np.ndarray | None = None) -> dict[str, float]:
    """Non-negative weights -> {name: percent}, largest first, summing to exactly 100 (largest
    remainder at DECIMALS); names whose share rounds to 0 are left out."""
    weights = np.clip(np.nan_to_num(np.asarray(weights, np.float64)), 0.0, None)
    if weights.sum() <= 0 and fallback is not None:
        weights = np.clip(np.nan_to_num(np.asarray(fallback, np.float64)), 0.0, None)
    if weights.sum() <= 0:
        weights = np.ones(len(names))
    unit = 10**DECIMALS
    exact = weights / weights.sum() * 100 * unit
    whole = np.floor(exact).astype(int)
    short = 100 * unit - int(whole.sum())
    order = sorted(range(len(names)), key=lambda i: (-(exact[i] - whole[i]), i))
    for i in order[:short]:
        whole[i] += 1
    ranked = sorted(range(len(names)), key=lambda i: (-whole[i], i))
    return {names[i]: float(whole[i]) / unit for i in ranked if whole[i] > 0}


def distance_from_healthy(x_norm: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[N, steps, F] -> [N, F] mean |x| over observed steps (the fallback's weights)."""
    seen = np.maximum(mask.sum(axis=1), 1.0)
    return (np.abs(x_norm) * mask).sum(axis=1) / seen


def explain_classes(
    graphs: Graphs,
    x_norm: np.ndarray,
    mask: np.ndarray,
    targets: Sequence[tuple[int, int]],
    probs: np.ndarray,
    names: Sequence[str],
) -> list[dict[str, float]]:
    drops = occlusion_drops(graphs, x_norm, mask, targets, probs)
    rows = [row for row, _ in targets]
    fallback = distance_from_healthy(x_norm[rows], mask[rows]) if rows else np.zeros((0, len(names)))
    return [shares(drops[i], names, fallback[i]) for i in range(len(targets))]


def explain_outlier(deviation: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    return shares(deviation, names)
