"""The catalog layer of a metric (compute, communication, storage, network, job): the catalog's own
`layer` where an entry has one, else from the name's prefix, so every metric lands in one board band."""

from __future__ import annotations

from stethoscope.catalog import LAYERS, layer_of

__all__ = ["LAYERS", "layer_of"]
