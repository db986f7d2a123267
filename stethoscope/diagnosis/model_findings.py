"""The model's findings as diagnosis findings (docs/design.md "Learned diagnosis"): rule ids model.*,
severity warning, level L2 unless the inventory's `stethoscope_model_level` raises it, confidence =
the probability; `explanation` and `path` in the evidence and beside it.

A rule's layer here is the model class its metric speaks for (`rule_class`: the model feature's
class where the metric is one, else its catalog band's: communication = communication + network).
A model finding on a node that a warning or critical rule finding of the same layer already names is
that finding's supporting evidence, not a second alarm: the rule finding carries it under `model`
("model agrees: ..."), the model finding `supports` the rule finding's id and only logs (the rule's
finding alerts, tickets or drains)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.layers import CLASS_LAYERS, rule_layer
from stethoscope.diagnosis.levels import LEVEL_ACTIONS, action_label, finding_id
from stethoscope.diagnosis.rules import Action, Rule
from stethoscope.model.finding import (
    JOB_RULE,
    STOPPED,
    SWEPT,
    SWITCH_RULE,
    UNKNOWN_CLASS,
    ModelFinding,
    switch_id,
)
from stethoscope.model.metadata import FEATURES, ModelMeta
from stethoscope.store.client import Store
from stethoscope.timeutil import iso

LEVELS = ("L1", "L2", "L3", "L4")
COOLDOWN_SECONDS = 3600  # as a rule's default: a flapping model finding re-opens without acting
SHOWN = 3  # metrics named in a message
SWITCH_LEVEL = "L2"
NAMED = 6  # nodes named in the line on the ones not classified
# what makes each kind of unclassified node classified
STREAM_HINT = "playbooks/agent.yml starts their 5-second stream"
CLASS_HINT = "playbooks/collect.yml records their class"
FINETUNE_HINT = "`stethoscope model finetune --class CLASS` adapts the model to a class"


@dataclass
class ModelUse:
    """The model a diagnosis runs, and after it the nodes it saw (their silent model findings resolve)."""

    meta: ModelMeta
    level: str = "L2"
    evaluated: set[str] = field(default_factory=set)
    ran: bool = False
    unjudged: dict[str, list[str]] = field(default_factory=dict)  # why not classified -> the nodes
    error: str = ""  # why it did not run in the last diagnosis ("" when it ran)

    def describe(self) -> str:
        """The model's name, and the classes whose nodes it did not classify."""
        if self.error:
            return f"{self.meta.name} (FAILED: {self.error})"
        if not self.unjudged:
            return self.meta.name
        parts, hints = [], []
        for what, names in sorted(self.unjudged.items()):
            shown = ", ".join(names[:NAMED]) + (
                f" and {len(names) - NAMED} more" if len(names) > NAMED else ""
            )
            if what in (SWEPT, STOPPED):
                parts.append(f"{shown} {what}")
                hints.append(STREAM_HINT)
            elif what == UNKNOWN_CLASS:
                parts.append(f"{shown}: {what} (no class fingerprint yet)")
                hints.append(CLASS_HINT)
            else:
                parts.append(f"{shown}: {what}, a class it was not trained for")
                hints.append(FINETUNE_HINT)
        advice = "; ".join(dict.fromkeys(hints))  # each once, in the order the parts name them
        unclassified = "; ".join(parts)
        return f"{self.meta.name} (not classified, scored against their peers only: {unclassified}; {advice})"


def explained(explanation: dict[str, float], shown: int = SHOWN) -> str:
    named = [(metric, share) for metric, share in explanation.items() if share >= 0.5]  # "0 %" says nothing
    parts = [f"{metric} {share:.0f} %" for metric, share in named[:shown]]
    return ", ".join(parts) + (", ..." if len(named) > shown else "")


def _message(f: ModelFinding) -> str:
    calibrated = f" ({f.calibration} class)" if f.calibration else ""
    if f.detail:  # model.job, model.switch: the job-relative detector says it in its own words
        agree = f"; the graphs agree ({', '.join(f.agrees)})" if f.agrees else ""
        waiting = f"; {len(f.folded)} findings on nodes that only wait folded in" if f.folded else ""
        return f"{f.node_id}: model {f.model}{calibrated}: {f.detail}{agree}{waiting}"
    what = (
        f"stands out from its peers (score {f.value:.2f}, {f.layer})"
        if f.rule_id == "model.outlier"
        else f"sees a {f.layer} fault, probability {f.value:.2f}"
    )
    where = f"; path {f.path}" if f.path and f.path != f.node_id else ""
    return f"{f.node_id}: model {f.model}{calibrated} {what}: {explained(f.explanation)}{where}"


def finding_dicts(
    store: Store, at_ms: int, nodes: Sequence[str] | None, use: ModelUse
) -> list[dict[str, Any]]:
    from stethoscope.model.findings import run_model  # numpy: only a command that runs the model pays it

    run = run_model(store, at_ms, nodes, use.meta)
    use.evaluated, use.ran, use.unjudged, use.error = set(run.evaluated), True, dict(run.unjudged), ""
    use.evaluated |= {switch_id(s) for s in run.switches}  # the switches' findings resolve too
    out = []
    for f in run.findings:
        # a switch is no host: its finding alerts (L2) at most, whatever the inventory raises models to
        level = min(use.level, SWITCH_LEVEL) if f.rule_id == SWITCH_RULE else use.level
        plan = LEVEL_ACTIONS[level]
        out.append(
            {
                "finding_id": finding_id(f.rule_id, f.node_id, _identity(f)),
                "rule_id": f.rule_id,
                "node_id": f.node_id,
                "device": "",
                "severity": "warning",
                "confidence": round(f.confidence, 4),
                "level": level,
                "first_seen": iso(at_ms),
                "message": _message(f),
                "evidence": json.dumps(f.evidence(), sort_keys=True),
                "actions": [action_label(a) for a in plan],
                "explanation": f.explanation,
                "path": f.path,
                # kept for execution, dropped from the printed finding
                "model_layer": f.layer,
                "value": f.value,
                "values": {f.rule_id: f.value},
                "nodes": list(f.nodes),  # model.switch: the nodes behind it that wait
                "plan": plan,
                "cooldown_seconds": COOLDOWN_SECONDS,
                "rule_message": "",
            }
        )
    return out


def _identity(f: ModelFinding) -> str:
    """What tells a model finding from another of its rule on its node, beside them in its id: a
    node hosts ranks of two jobs, each job's culprits there are a finding of their own."""
    return f"job {f.job}" if f.rule_id == JOB_RULE else ""


def rule_class(rule: Rule, catalog: Catalog | None) -> str:
    """The model class a rule speaks for: that of the model feature its metric is (a counter's
    `_total` is its `_per_second` feature: AER is communication to the model, whatever its catalog
    band), else the class of its catalog band."""
    for metric in rule.metrics:
        base = metric.removesuffix("_total").removesuffix("_per_second")
        for feature in FEATURES:
            if feature.metric.removesuffix("_per_second") == base:
                return feature.layer
    band = rule_layer(rule, catalog)
    return next((name for name, bands in CLASS_LAYERS.items() if band in bands), "compute")


def pair(findings: list[dict[str, Any]], rules: list[Rule], catalog: Catalog | None) -> None:
    """Each model finding beside the most severe warning or critical rule finding of its layer on its
    node (findings sorted most severe first), in place."""
    classes = {rule.rule_id: rule_class(rule, catalog) for rule in rules}
    bands = {rule.rule_id: rule_layer(rule, catalog) for rule in rules}
    for model in (f for f in findings if f["rule_id"].startswith("model.")):
        host = next(
            (
                f
                for f in findings
                if f["rule_id"] in classes
                and f["severity"] in ("warning", "critical")
                and model["node_id"] in (f["node_id"], *f.get("nodes", []))
                and classes[f["rule_id"]] == model["model_layer"]
            ),
            None,
        )
        if host is None:
            continue
        model["supports"] = host["finding_id"]
        model["plan"] = (Action("log", ()),)
        model["actions"] = [action_label(a) for a in model["plan"]]
        evidence = json.loads(model["evidence"])
        evidence["supports"] = host["finding_id"]
        evidence["supports_band"] = bands[host["rule_id"]]  # where the board shows the rule finding
        model["evidence"] = json.dumps(evidence, sort_keys=True)
        host.setdefault("model", []).append(
            {
                "finding_id": model["finding_id"],
                "rule_id": model["rule_id"],
                "layer": model["model_layer"],
                "confidence": model["confidence"],
                "explanation": model["explanation"],
                "path": model["path"],
            }
        )


def agrees(support: dict[str, Any]) -> str:
    """'model agrees: communication 0.93 (rdma_qps_dropped_per_second 42 %, ...)'."""
    what = "outlier from its peers" if support["rule_id"] == "model.outlier" else support["layer"]
    return f"model agrees: {what} {support['confidence']:.2f} ({explained(support['explanation'])})"


def level_of(setting: Any) -> str:
    """The inventory's `stethoscope_model_level` (default L2); ValueError for anything else."""
    level = str(setting or "L2").upper()
    if level not in LEVELS:
        raise ValueError(f"stethoscope_model_level: {setting!r} is not one of {', '.join(LEVELS)}")
    return level
