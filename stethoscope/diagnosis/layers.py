"""The catalog layer of a metric (compute, communication, storage, network, job): the catalog's own
`layer` where an entry has one, else from the name's prefix, so every metric lands in one board band.
A model class speaks for one or more of them (CLASS_LAYERS)."""

from __future__ import annotations

from stethoscope.catalog import LAYERS, layer_of

__all__ = ["CLASS_LAYERS", "LAYERS", "layer_of"]

# the model's fault classes (docs/design.md: communication = catalog layers communication + network);
# a job's step time is the compute class's, as in the model's features
CLASS_LAYERS = {
    "communication": ("communication", "network"),
    "storage": ("storage",),
    "compute": ("compute", "job"),
}
