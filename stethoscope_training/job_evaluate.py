"""How the graphs alone, the deterministic job-relative detector alone, and both together (what
`diagnose` runs) do on job scenes: for each fault kind the share of scenes whose culprit
was found (the culprit rank, or the congested switch), the share of a faulty job's peers given a
finding of their own, the share of healthy jobs with any finding, and how long before the impact a
congested switch is named.

- graphs: findings.from_windows(relative=False), the node findings of the ONNX classifier and
  detector; a culprit rank is found when its node gets a finding of the fault's class (or an outlier
  finding whose largest deviation speaks for it), a switch when a finding's fault path runs
  through it;
- detector: relative.relative_findings with no graph finding: model.job and model.switch alone;
- combined: findings.from_windows(relative=True).

A peer's "finding of its own" is any finding on its node other than its job's one finding (the
culprit's, or the finding that stands for the job's nodes together); a healthy job is one without
the fault and not crossing the congested switch, and has a finding when one is on any of its nodes
or names it (a job's finding, a switch's naming the jobs crossing it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stethoscope.model.features import normalise
from stethoscope.model.finding import ModelFinding
from stethoscope.model.findings import from_windows
from stethoscope.model.inference import Graphs
from stethoscope.model.path import ARROW
from stethoscope.model.relative import JOB_RULE, SWITCH_RULE, relative_findings, switch_id
from stethoscope.model.switches import BASELINE, RECENT, congested
from stethoscope_training.jobs import Scene

PATHS = ("graphs", "detector", "combined")
FAULTS = ("straggler", "input_stall", "switch_congestion")
LEAD_FROM = BASELINE + RECENT  # the first window end the switch detector can judge
STEP_SECONDS = 5


@dataclass
class Outcome:
    """One scene's figures on one path."""

    found: bool | None = None  # the culprit (rank or switch) found; None for a healthy scene
    kind_right: bool | None = None  # and named with the fault's class
    peers: int = 0
    peers_with_own: int = 0
    healthy_jobs: int = 0
    healthy_jobs_with: int = 0
    idle: int = 0
    idle_with: int = 0
    findings: int = 0
    wrong_switches: int = 0  # switch findings naming a switch without congestion


@dataclass
class SceneResult:
    family: str
    kind: str
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    lead_s: float | None = None  # congestion: impact - first detection, seconds (None: never named)
    impact: int = -1


def findings_of(graphs: Graphs, scene: Scene) -> dict[str, list[ModelFinding]]:
    windows, topology = scene.windows(), scene.topology
    meta = graphs.meta
    rows = np.flatnonzero(windows.mask.reshape(len(windows.node_ids), -1).max(axis=1) > 0)
    x = normalise(windows.x[rows], windows.mask[rows], meta, [windows.hw_class[i] for i in rows])
    detector = relative_findings(meta, windows, rows, x, windows.mask[rows], [], topology).findings
    return {
        "graphs": from_windows(graphs, windows, topology, relative=False).findings,
        "detector": detector,
        "combined": from_windows(graphs, windows, topology, relative=True).findings,
    }


def _culprit_found(scene: Scene, findings: list[ModelFinding], path: str) -> tuple[bool, bool]:
    truth = scene.truth
    if scene.kind == "switch_congestion":
        switch = truth["switch"]
        if path == "graphs":
            hit = any(f"{ARROW}{switch}{ARROW}" in f.path for f in findings)
        else:
            hit = any(f.rule_id == SWITCH_RULE and f.node_id == switch_id(switch) for f in findings)
        return hit, hit
    node = scene.node_ids[truth["node"]]
    if path == "graphs":
        on_node = [f for f in findings if f.node_id == node]
        return bool(on_node), any(f.layer == truth["layer"] for f in on_node)
    named = [
        f for f in findings if f.rule_id == JOB_RULE and f.job == truth["job"] and truth["rank"] in f.ranks
    ]
    return bool(named), any(f.layer == truth["layer"] for f in named)


def _own(f: ModelFinding, node: str, job: str, scene: Scene) -> bool:
    """Is f a finding of the node's own (not its job's one finding, not the true culprit's)?"""
    if f.node_id != node:
        return False
    if f.rule_id == JOB_RULE and f.job == job:
        return bool(f.ranks) and scene.truth.get("rank") not in f.ranks
    return True


def outcome(scene: Scene, findings: list[ModelFinding], path: str) -> Outcome:
    out = Outcome(findings=len(findings))
    truth = scene.truth
    if scene.kind != "healthy":
        out.found, out.kind_right = _culprit_found(scene, findings, path)
    faulty = {truth["job"]} if "job" in truth else set(truth.get("crossing", ()))
    by_job: dict[str, list[str]] = {}
    for node, job in zip(scene.node_ids, scene.job, strict=True):
        by_job.setdefault(job, []).append(node)
    culprit = scene.node_ids[truth["node"]] if "node" in truth else None
    for job, nodes in by_job.items():
        if not job:
            out.idle += len(nodes)
            out.idle_with += sum(any(f.node_id == n for f in findings) for n in nodes)
        elif job in faulty:
            peers = [n for n in nodes if n != culprit]
            out.peers += len(peers)
            out.peers_with_own += sum(any(_own(f, n, job, scene) for f in findings) for n in peers)
        else:
            out.healthy_jobs += 1
            out.healthy_jobs_with += any(
                f.node_id in nodes or (f.rule_id == JOB_RULE and f.job == job) or job in f.jobs
                for f in findings
            )
    congested_switch = switch_id(truth["switch"]) if "switch" in truth else None
    out.wrong_switches = sum(f.rule_id == SWITCH_RULE and f.node_id != congested_switch for f in findings)
    return out


def lead(scene: Scene) -> float | None:
    """Seconds from the first window end at which the switch detector names the congested switch to
    the impact (positive: named before the jobs' steps slowed); None when never named."""
    topology = scene.topology
    for end in range(LEAD_FROM, scene.values.shape[1] + 1):
        windows = scene.windows(end)
        found, _ = congested(windows.node_ids, windows.x, windows.mask, windows.job, topology)
        if any(c.switch == scene.truth["switch"] for c in found):
            impact = scene.truth.get("impact", -1)
            return float((impact - end) * STEP_SECONDS) if impact >= 0 else float("inf")
    return None


def evaluate_scenes(graphs: Graphs, scenes: Iterable[Scene], with_lead: bool = True) -> list[SceneResult]:
    results = []
    for scene in scenes:
        result = SceneResult(scene.family, scene.kind, impact=int(scene.truth.get("impact", -1)))
        for path, findings in findings_of(graphs, scene).items():
            result.outcomes[path] = outcome(scene, findings, path)
        if with_lead and scene.kind == "switch_congestion":
            result.lead_s = lead(scene)
        results.append(result)
    return results


def _share(numerator: int, denominator: int, digits: int = 4) -> float | None:
    return round(numerator / denominator, digits) if denominator else None


def scores(results: list[SceneResult]) -> dict[str, Any]:
    """Per path: per fault kind the culprit's recall (and with its class right), the peers' and the
    healthy jobs' shares with findings; per family the recall; the switch findings' lead."""
    out: dict[str, Any] = {"scenes": len(results), "paths": {}}
    for path in PATHS:
        o = [r.outcomes[path] for r in results]
        entry: dict[str, Any] = {}
        for kind in FAULTS:
            mine = [x for r, x in zip(results, o, strict=True) if r.kind == kind]
            entry[kind] = {
                "scenes": len(mine),
                "culprit_recall": _share(sum(bool(x.found) for x in mine), len(mine)),
                "culprit_and_class_recall": _share(sum(bool(x.kind_right) for x in mine), len(mine)),
            }
        peers = sum(x.peers for x in o)
        entry["peers_with_own_finding_percent"] = _percent(sum(x.peers_with_own for x in o), peers)
        entry["peers"] = peers
        jobs = sum(x.healthy_jobs for x in o)
        entry["healthy_jobs_with_finding_percent"] = _percent(sum(x.healthy_jobs_with for x in o), jobs)
        entry["healthy_jobs"] = jobs
        idle = sum(x.idle for x in o)
        entry["idle_nodes_with_finding_percent"] = _percent(sum(x.idle_with for x in o), idle)
        entry["wrong_switch_findings"] = sum(x.wrong_switches for x in o)
        families: dict[str, Any] = {}
        for r, x in zip(results, o, strict=True):
            fam = families.setdefault(
                r.family, {"kind": r.kind, "scenes": 0, "found": 0, "jobs": 0, "jobs_with": 0}
            )
            fam["scenes"] += 1
            fam["found"] += bool(x.found)
            fam["jobs"] += x.healthy_jobs
            fam["jobs_with"] += x.healthy_jobs_with
        entry["families"] = {
            name: {
                "kind": f["kind"],
                "scenes": f["scenes"],
                **({"culprit_recall": _share(f["found"], f["scenes"])} if f["kind"] != "healthy" else {}),
                "healthy_jobs_with_finding_percent": _percent(f["jobs_with"], f["jobs"]),
            }
            for name, f in families.items()
        }
        out["paths"][path] = entry
    leads = [r.lead_s for r in results if r.kind == "switch_congestion"]
    timed = [x for x in leads if x is not None and np.isfinite(x)]
    out["switch_lead"] = {
        "scenes": len(leads),
        "named": sum(x is not None for x in leads),
        "named_before_impact": sum(x is not None and x > 0 for x in leads),
        "no_impact_in_window": sum(x is not None and not np.isfinite(x) for x in leads),
        "median_lead_s": float(np.median(timed)) if timed else None,
        "lead_s_quartiles": [float(q) for q in np.quantile(timed, [0.25, 0.75])] if timed else None,
    }
    return out


def _percent(numerator: int, denominator: int) -> float | None:
    return round(100.0 * numerator / denominator, 3) if denominator else None


def render(s: dict[str, Any], title: str) -> str:
    lines = [f"{title}: {s['scenes']} scenes (jobs over a fleet; graphs alone, detector alone, both)"]
    lines.append(f"  {'':<34}" + "".join(f"{p:>10}" for p in PATHS))
    for kind in FAULTS:
        cells = [s["paths"][p][kind]["culprit_recall"] for p in PATHS]
        lines.append(f"  {kind + ' culprit found':<34}" + "".join(_cell(c) for c in cells))
        cells = [s["paths"][p][kind]["culprit_and_class_recall"] for p in PATHS]
        lines.append(f"  {'  ... and its class named':<34}" + "".join(_cell(c) for c in cells))
    for key, label in (
        ("peers_with_own_finding_percent", "peers with a finding of their own %"),
        ("healthy_jobs_with_finding_percent", "healthy jobs with a finding %"),
        ("idle_nodes_with_finding_percent", "idle nodes with a finding %"),
    ):
        lines.append(f"  {label:<34}" + "".join(_cell(s["paths"][p][key], 2) for p in PATHS))
    lines.append(
        f"  {'switch findings on a wrong switch':<34}"
        + "".join(f"{s['paths'][p]['wrong_switch_findings']:>10}" for p in PATHS)
    )
    lead = s["switch_lead"]
    if lead["scenes"]:
        median = "-" if lead["median_lead_s"] is None else f"{lead['median_lead_s']:.0f} s"
        lines.append(
            f"  congested switch named before the impact in {lead['named_before_impact']} of "
            f"{lead['scenes']} scenes (median lead {median}; {lead['no_impact_in_window']} without an "
            "impact in the window)"
        )
    return "\n".join(lines)


def _cell(value: float | None, digits: int = 3) -> str:
    return f"{'-':>10}" if value is None else f"{value:>10.{digits}f}"
