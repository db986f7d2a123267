"""The calibration audit (docs/design.md "Reports and audit"): for each fault of the past, how many
minutes before its impact today's diagnosis (rules and model) first warned.

Each fault is re-diagnosed at instants every 5 minutes over the 6 hours before its impact, oldest
first, restricted to its node and to the rules of its layer, through the same `diagnose` entry as
`stethoscope diagnose`. The first warning is the earliest instant with a finding of the fault's layer
on its node and device. Data comes from the raw rows or, where those are gone, from `fault_windows`,
replayed into a scratch database of the same store (the live metrics are never written).

Layers of findings: a rule's finding is of its rule's layer (layers.rule_layer). A model finding's layer comes
from its rule id: model.communication covers the catalog layers communication and network (the
model's communication class is both), model.storage storage, model.compute compute; model.outlier
takes the layer of the feature with the largest share in its explanation. A finding that carries a
`layer` key is taken at its word. A node-level finding (device "") counts for a fault on any device
of its node; a finding on gpu2/link3 counts for a fault on gpu2, and the reverse.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.layers import CLASS_LAYERS, rule_layer
from stethoscope.diagnosis.rules import Rule
from stethoscope.store.client import Store
from stethoscope.store.faults import (
    WINDOW_MS,
    Fault,
    first_sample_ms,
    replay_window,
    window_metrics,
    window_rows,
)
from stethoscope.store.schema import single_node_ddl
from stethoscope.terminal import terminal_safe

STEP_MS = 5 * 60 * 1000
SCRATCH_TTL_DAYS = 3650
MODEL_LAYERS = {f"model.{klass}": layers for klass, layers in CLASS_LAYERS.items()}
MISSED = "missed"
UNREPLAYABLE = "not replayable"


def rules_of_layer(rules: list[Rule], layer: str, reported: set[str], catalog: Catalog) -> list[Rule]:
    """The rules a fault of `layer` is replayed with: those of its layer, and of those only the ones
    naming a metric the node reported in the window (a rule whose metrics are all absent cannot
    match: it saves most queries)."""
    return [
        rule for rule in rules if rule_layer(rule, catalog) == layer and reported.intersection(rule.metrics)
    ]


def finding_layers(finding: dict[str, Any], catalog: Catalog) -> set[str]:
    if finding.get("layer"):
        return {str(finding["layer"])}
    rule_id = str(finding["rule_id"])
    if rule_id in MODEL_LAYERS:
        return set(MODEL_LAYERS[rule_id])
    # model.outlier: the class its largest deviation's feature speaks for; model.job, model.switch:
    # the class of what the culprit spends longer on, communication for a switch
    if rule_id in ("model.outlier", "model.job", "model.switch"):
        return set(CLASS_LAYERS.get(str(finding.get("model_layer") or ""), ()))
    return set(finding.get("_layers", ()))


def _same_device(fault_device: str, device: str) -> bool:
    if not fault_device or not device or fault_device == device:
        return True
    return device.startswith(fault_device + "/") or fault_device.startswith(device + "/")


def warns(fault: Fault, finding: dict[str, Any], catalog: Catalog) -> bool:
    """Is this finding a warning of `fault`: its layer, its node, its device?"""
    nodes = [finding["node_id"], *(finding.get("nodes") or [])]
    if fault.node_id not in nodes:
        return False
    if fault.layer not in finding_layers(finding, catalog):
        return False
    return _same_device(fault.device, str(finding.get("device") or ""))


@dataclass
class FaultResult:
    fault: Fault
    source: str  # metrics | fault_windows | "" (not replayable)
    lead_minutes: float | None = None  # None: missed or not replayable
    first_warning_ms: int | None = None
    rule_id: str = ""
    message: str = ""
    instants: int = 0

    @property
    def outcome(self) -> str:
        if not self.source:
            return UNREPLAYABLE
        return MISSED if self.first_warning_ms is None else "warned"

    def as_dict(self) -> dict[str, Any]:
        from stethoscope.timeutil import iso

        return {
            **self.fault.as_dict(),
            "outcome": self.outcome,
            "source": self.source,
            "lead_minutes": self.lead_minutes,
            "first_warning_at": iso(self.first_warning_ms) if self.first_warning_ms is not None else None,
            "rule_id": self.rule_id,
            "message": self.message,
            "instants": self.instants,
        }


@dataclass
class KindResult:
    kind: str
    faults: int
    replayed: int
    missed: int
    median_lead_minutes: float | None  # None: nothing of this kind could be replayed
    under_target: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Audit:
    target_minutes: float
    faults: list[FaultResult] = field(default_factory=list)
    kinds: list[KindResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def under_target(self) -> bool:
        return any(kind.under_target for kind in self.kinds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "lead_target_minutes": self.target_minutes,
            "under_target": self.under_target,
            "kinds": [k.as_dict() for k in self.kinds],
            "faults": [f.as_dict() for f in self.faults],
            "seconds": round(self.seconds, 3),
        }


def _scratch(store: Store) -> Store:
    """A handle on a scratch database of the same store (same connection): the replay goes there."""
    scratch = copy.copy(store)
    scratch.database = f"{store.database}_audit_scratch"
    store.command(f"DROP DATABASE IF EXISTS {scratch.database}")
    # a kept window may be older than the raw TTL: the scratch copy must not expire it on the next merge
    for statement in single_node_ddl(scratch.database, raw_ttl_days=SCRATCH_TTL_DAYS):
        store.command(statement)
    return scratch


def _instants(fault: Fault, first_sample_ms: int) -> Iterable[int]:
    """Every 5 minutes back from impact over 6 hours, oldest first; an instant before the node's first
    sample sees no data at all (rules read only samples at or before it), so the scan starts after."""
    start = fault.impact_ms - WINDOW_MS
    if first_sample_ms > start:
        start += -(-(first_sample_ms - start) // STEP_MS) * STEP_MS
    return range(start, fault.impact_ms + 1, STEP_MS)


DiagnoseFn = Callable[..., list[dict[str, Any]]]


def audit_fault(
    store: Store,
    fault: Fault,
    rules: list[Rule],
    catalog: Catalog,
    diagnose_fn: DiagnoseFn = diagnose,
    **options: Any,
) -> FaultResult:
    raw, kept = window_rows(store, fault, "metrics"), window_rows(store, fault, "fault_windows")
    if not raw and not kept:
        return FaultResult(fault, "")
    source, where = "metrics", store
    if kept > raw:  # the raw TTL (or a delete) took rows the kept window still has
        source, where = "fault_windows", _scratch(store)
        replay_window(store, fault, where.database)
    mine = rules_of_layer(rules, fault.layer, window_metrics(where, fault), catalog)
    layers = {rule.rule_id: {rule_layer(rule, catalog)} for rule in mine}
    result = FaultResult(fault, source)
    try:
        for at in _instants(fault, first_sample_ms(where, fault)):
            result.instants += 1
            findings = diagnose_fn(where, mine, at, nodes=[fault.node_id], **options)
            hits = [
                f for f in findings if warns(fault, {**f, "_layers": layers.get(f["rule_id"], ())}, catalog)
            ]
            if hits:
                result.first_warning_ms = at
                result.lead_minutes = (fault.impact_ms - at) / 60_000
                result.rule_id, result.message = hits[0]["rule_id"], hits[0]["message"]
                break
    finally:
        if where is not store:
            store.command(f"DROP DATABASE IF EXISTS {where.database}")
    return result


def summarise(results: list[FaultResult], target_minutes: float) -> list[KindResult]:
    kinds = []
    for kind in sorted({r.fault.kind for r in results}):
        mine = [r for r in results if r.fault.kind == kind]
        replayed = [r for r in mine if r.source]
        # a missed fault gave no lead at all: it counts as 0 in its kind's median
        leads = [r.lead_minutes or 0.0 for r in replayed]
        median = statistics.median(leads) if leads else None
        missed = sum(1 for r in replayed if r.first_warning_ms is None)
        under = median is None or median < target_minutes  # no data left is no evidence of a lead
        kinds.append(KindResult(kind, len(mine), len(replayed), missed, median, under))
    return kinds


def run_audit(
    store: Store,
    faults: list[Fault],
    rules: list[Rule],
    catalog: Catalog,
    target_minutes: float,
    diagnose_fn: DiagnoseFn = diagnose,
    **options: Any,
) -> Audit:
    """Audit every fault; `options` go to `diagnose_fn` as they are (the model's, where it has any)."""
    started = time.perf_counter()
    results = [audit_fault(store, f, rules, catalog, diagnose_fn, **options) for f in faults]
    audit = Audit(target_minutes, results, summarise(results, target_minutes))
    audit.seconds = time.perf_counter() - started
    return audit


def render(audit: Audit) -> str:
    if not audit.faults:
        return "no faults recorded: nothing to audit (`stethoscope fault add` or `audit --faults FILE`)"
    lines = [f"audit of {len(audit.faults)} faults, lead target {audit.target_minutes:g} min"]
    lines.append(f"{'kind':<24}{'faults':>7}{'replayed':>9}{'missed':>7}{'median lead':>13}  verdict")
    for k in audit.kinds:
        median = "-" if k.median_lead_minutes is None else f"{k.median_lead_minutes:.0f} min"
        verdict = "NO DATA" if k.median_lead_minutes is None else ("UNDER TARGET" if k.under_target else "ok")
        lines.append(f"{k.kind:<24}{k.faults:>7}{k.replayed:>9}{k.missed:>7}{median:>13}  {verdict}")
    lines.append("")
    lines.append(f"{'node':<14}{'device':<14}{'kind':<24}{'impact':<31}{'lead':>15}  first warning")
    for r in audit.faults:
        lead = r.outcome if r.lead_minutes is None else f"{r.lead_minutes:.0f} min"
        said = f"{r.rule_id}: {r.message}" if r.rule_id else f"({r.source or 'no rows left'})"
        impact = r.fault.as_dict()["impact_at"]
        where = f"{r.fault.node_id:<14}{r.fault.device or '-':<14}{r.fault.kind:<24}"
        lines.append(f"{where}{impact:<31}{lead:>15}  {said}")
    return "\n".join(map(terminal_safe, lines))
