"""How stethoscope_training.evaluate turns labels and predictions into the figures it records."""

from __future__ import annotations

import numpy as np

from stethoscope_training.evaluate import class_scores

# 37 episodes whose per-class F1s, each rounded to 4 places, average to 0.7965; exact, 0.79656
LABELS = [int(c) for c in "3221100003232232222313201320323003020"]
PRED = [int(c) for c in "3221100303232202221313201310322301020"]


def _exact_f1s(confusion: np.ndarray) -> list[float]:
    f1s = []
    for j in range(len(confusion)):
        precision = confusion[j, j] / confusion[:, j].sum()
        recall = confusion[j, j] / confusion[j, :].sum()
        f1s.append(2 * precision * recall / (precision + recall))
    return f1s


def test_macro_f1_averages_the_exact_class_f1s_and_rounds_once():
    scores = class_scores(np.array(LABELS), np.array(PRED))
    confusion = np.array(scores["confusion"])
    assert confusion.sum() == len(LABELS)
    assert scores["macro_f1"] == round(float(np.mean(_exact_f1s(confusion))), 4) == 0.7966
