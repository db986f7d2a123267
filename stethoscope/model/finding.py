"""One finding of the learned diagnosis (docs/design.md "Learned diagnosis"), as findings.py makes
it and diagnosis/model_findings.py turns it into a diagnosis finding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# the nodes its UNKNOWN finding names, by why the model could not judge them
SWEPT = "only swept (no stream)"
STOPPED = "whose stream stopped"
UNKNOWN_CLASS = "an unknown GPU class"
JOB_RULE = "model.job"
SWITCH_RULE = "model.switch"
SWITCH_PREFIX = "switch:"  # a switch's finding's node_id, as the rules' correlate_by: switch names it


@dataclass
class ModelFinding:
    # model.communication | model.storage | model.compute | model.outlier (a node's own window);
    # model.job (a job's culprit ranks on one node) | model.switch (congestion behind a switch:
    # node_id is `switch:<name>`, as the rules' correlated findings name a switch)
    rule_id: str
    node_id: str
    layer: str  # the fault class it speaks for: communication, storage, compute
    confidence: float
    value: float  # the class's probability, the outlier score, the culprit's excess, the waits' rise
    threshold: float
    explanation: dict[str, float]  # metric -> percent, largest first, summing to 100
    path: str = ""
    model: str = ""
    model_version: str = ""
    detail: str = ""  # model.job / model.switch: what it found, in words
    job: str = ""  # model.job: the job, and its culprit ranks on the node (several: the node's fault)
    ranks: list[str] = field(default_factory=list)
    held_back: list[str] = field(default_factory=list)  # model.job: the ranks waiting for it
    nodes: list[str] = field(default_factory=list)  # model.switch: the nodes behind it that wait
    jobs: list[str] = field(default_factory=list)  # model.switch: the jobs crossing it
    # the node-level findings this one stands for (peers that only wait): "rule_id node" each
    folded: list[str] = field(default_factory=list)
    agrees: list[str] = field(default_factory=list)  # the graphs' findings on the culprit that agree
    calibration: str = ""  # "self-calibrated": the node's class normalisation learned from the store

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "model_version": self.model_version,
            "layer": self.layer,
            "confidence": round(self.confidence, 4),
            "value": round(self.value, 4),
            "threshold": self.threshold,
            "explanation": self.explanation,
            "path": self.path,
        }
        extra = {
            "job": self.job,
            "ranks": self.ranks,
            "held_back": self.held_back,
            "nodes": self.nodes,
            "jobs": self.jobs,
            "folded": self.folded,
            "agrees": self.agrees,
            "calibration": self.calibration,
        }
        out.update({key: value for key, value in extra.items() if value})
        return out


def switch_id(switch: str) -> str:
    """A switch's findings' node_id: `switch:leaf1` (not a node: no host incident takes it, the board
    shows it on the nodes behind it)."""
    return SWITCH_PREFIX + switch
