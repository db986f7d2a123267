"""The catalog layer of a metric (compute, communication, storage, network, job): the catalog's own
`layer` where an entry has one, else from the name's prefix, so every metric lands in one board band.
A model class speaks for one or more of them (CLASS_LAYERS). A rule's findings are of one layer
(`rule_layer`), wherever they are counted: the audit, the board, the model's pairing, `fault confirm`."""

from __future__ import annotations

from stethoscope.catalog import LAYERS, Catalog, layer_of
from stethoscope.diagnosis.rules import Rule

__all__ = ["CLASS_LAYERS", "LAYERS", "layer_of", "rule_layer"]

# the model's fault classes (docs/design.md: communication = catalog layers communication + network);
# a job's step time is the compute class's, as in the model's features
CLASS_LAYERS = {
    "communication": ("communication", "network"),
    "storage": ("storage",),
    "compute": ("compute", "job"),
}


def rule_layer(rule: Rule, catalog: Catalog | None) -> str:
    """The layer of a rule's findings: the catalog layer of the first metric it names, the one it
    judges; later ones qualify it (nvlink_physical_error's GPU temperature below 70 C: a link fault,
    not heat). Compute for a rule that names none."""
    return layer_of(catalog, rule.metrics[0]) if rule.metrics else "compute"
