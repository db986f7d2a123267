"""The decision the held-out scores measure (docs/design.md "Learned diagnosis"): the most probable
class, when it is a fault class whose probability reaches its threshold; else healthy. One rule for
the findings at run time and for every score that training and evaluation record."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stethoscope.model.metadata import CLASSES


def decide(probs: np.ndarray, thresholds: dict[str, float], classes: Sequence[str] = CLASSES) -> np.ndarray:
    """[N, classes] probabilities -> [N] the class index a finding would name (0: none)."""
    best = probs.argmax(axis=1)
    needed = np.array([0.0, *(thresholds[name] for name in classes[1:])], dtype=np.float32)
    reached = probs[np.arange(len(best)), best] >= needed[best]
    return np.where(reached, best, 0)
