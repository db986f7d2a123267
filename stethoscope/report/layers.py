"""The catalog layer of a metric: kept in diagnosis (model findings pair with rule findings by layer
there); the board's bands read it from here."""

from __future__ import annotations

from stethoscope.diagnosis.layers import LAYERS, layer_of

__all__ = ["LAYERS", "layer_of"]
