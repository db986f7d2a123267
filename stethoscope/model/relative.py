"""The fleet-relative layer over the graphs' node findings (docs/design.md "Learned diagnosis"):
the job-relative detector's culprits (jobs.py) and the congested switches (switches.py)
become findings of their own, and the graphs' findings on nodes that only wait for them are folded
into them: an SRE is told which rank holds a job back, not sent to its waiting peers. A job's
culprit ranks on one node are one finding naming them (a node runs several ranks of a job: its disk
stalls all of them); a congested switch's finding is the switch's, `switch:<name>` as the rules'
correlated findings name it, never a node.

A graph's finding on a node
- that hosts a culprit rank: folded into the culprit's finding as agreement when it speaks for the
  same class or is the outlier detector's; else kept (the node may have a second problem);
- behind a congested switch and of the communication class: folded into the switch's finding;
- of a job that has a culprit or crosses a congested switch, on a node that does not stand out in a
  feature of the finding's class (jobs.stands_out: from its job's nodes in any node feature, from the
  nodes behind its switch of its class and state in those a job does not set): folded, a peer that
  only waits;
- of another judged job (MIN_RANKS nodes or more, or ranks on two nodes or more the detector judged
  against MIN_RANKS ranks elsewhere), on a node that does not stand out so: the job's shared state,
  not the node's; when half the job's nodes or more get the same class and the job slowed down over
  the window (its step SLOWED times as long in the recent steps as in the first ones: a checkpoint's
  pause or a warm-up passes, a shared cause stays), one finding for the job (on its first node)
  stands for them, else they are dropped;
- anywhere else: kept as it is."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from stethoscope.model.finding import JOB_RULE, SWITCH_RULE, ModelFinding, switch_id
from stethoscope.model.jobs import MIN_RANKS, SHARE, Culprit, JobJudgement, Z, judge_jobs, stands_out
from stethoscope.model.jobs import RECENT as JOB_RECENT
from stethoscope.model.metadata import ModelMeta
from stethoscope.model.path import ARROW, Place
from stethoscope.model.robust import nanmedian
from stethoscope.model.switches import BASELINE, RISE, STEP_TIME, Congestion, congested

COMPUTE_NAME = "compute (step - collective - input)"
SLOWED = 1.15
# node features a job's own work sets (its load, its traffic): compared within a job only
JOB_SET = ("gpu_power_watts", "gpu_utilization_percent", "ib_port_xmit_wait_per_second")


@dataclass
class Relative:
    """What the relative layer found, and which graph findings it folded (for evaluation)."""

    findings: list[ModelFinding] = field(default_factory=list)
    judgement: JobJudgement = field(default_factory=JobJudgement)
    congestion: list[Congestion] = field(default_factory=list)
    switches: list[str] = field(default_factory=list)  # every switch judged
    folded: list[ModelFinding] = field(default_factory=list)
    # the graphs' findings whose explanation is shown (kept, or standing for a job): only these are
    # explained, and a job's finding shares its explanation dict with the member it stands for
    explain: list[ModelFinding] = field(default_factory=list)
    stands_out: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), bool))  # [N, F]


def _groups(keys: list[tuple]) -> list[list[int]]:
    groups: dict[tuple, list[int]] = {}
    for index, key in enumerate(keys):
        if all(key):
            groups.setdefault(key, []).append(index)
    return list(groups.values())


def relative_findings(
    meta: ModelMeta,
    windows,  # features.Windows
    rows: np.ndarray,  # the Windows indexes x_norm's rows are
    x_norm: np.ndarray,
    mask: np.ndarray,
    graph_findings: list[ModelFinding],
    topology: Mapping[str, Place],
) -> Relative:
    node_ids = windows.node_ids
    job_of = list(windows.job)
    switch_of = [topology.get(node, Place()).switch for node in node_ids]
    out = Relative(judgement=judge_jobs(windows.ranks))
    out.congestion, out.switches = congested(node_ids, windows.x, windows.mask, job_of, topology)
    # against its job's nodes: every node feature; against the nodes behind its switch (of its class
    # and state, running other jobs): only those a job does not set (temperatures, clocks, errors)
    node_features = np.array([not f.metric.startswith("train_") for f in meta.features])
    own_features = node_features & np.array([f.metric not in JOB_SET for f in meta.features])
    row_jobs = [job_of[i] for i in rows]
    # running a job now (its step time in half the recent steps): a job that ended leaves idle nodes
    busy = ((mask[:, -JOB_RECENT:, STEP_TIME] > 0).mean(axis=1) >= 0.5).tolist()
    by_switch = _groups(
        [(switch_of[i], windows.hw_class[i], "job" if b else "idle") for i, b in zip(rows, busy, strict=True)]
    )
    standing = np.zeros((len(node_ids), len(meta.features)), dtype=bool)
    standing[rows] = stands_out(x_norm, mask, _groups([(j,) for j in row_jobs]), node_features) | stands_out(
        x_norm, mask, by_switch, own_features
    )
    layer_of = np.array([f.layer for f in meta.features])
    out.stands_out = standing

    # a job's culprit ranks on one node: one finding naming them
    on_node: dict[tuple[str, int], list[Culprit]] = {}
    for culprit in out.judgement.culprits:
        on_node.setdefault((culprit.job, culprit.node), []).append(culprit)
    job_findings = {key: _culprit_finding(found, windows, node_ids) for key, found in on_node.items()}
    culprits: dict[str, list[Culprit]] = {}
    by_job: dict[str, ModelFinding] = {}
    for (job, node), found in on_node.items():
        culprits.setdefault(node_ids[node], []).extend(found)
        by_job.setdefault(job, job_findings[(job, node)])
    switch_findings = [_switch_finding(s, node_ids) for s in out.congestion]
    behind = {
        node: f
        for s, f in zip(out.congestion, switch_findings, strict=True)
        for node, switch in zip(node_ids, switch_of, strict=True)
        if switch == s.switch
    }
    crossing: dict[str, ModelFinding] = {}
    for s, f in zip(out.congestion, switch_findings, strict=True):
        for crossed in s.jobs:
            crossing.setdefault(crossed.job, f)
    index_of = {node: i for i, node in enumerate(node_ids)}
    size: dict[str, int] = {}
    for group in _groups([(j,) for j in row_jobs]):
        size[row_jobs[group[0]]] = len(group)

    shared: dict[tuple[str, str], list[ModelFinding]] = {}
    kept: list[ModelFinding] = []
    for f in graph_findings:
        node = index_of[f.node_id]
        job = job_of[node]
        hosted = culprits.get(f.node_id)
        if hosted:
            same = [c for c in hosted if c.layer == f.layer or f.rule_id == "model.outlier"]
            if same:
                job_findings[(same[0].job, same[0].node)].agrees.append(f"{f.rule_id} {f.confidence:.2f}")
                out.folded.append(f)
                continue
            kept.append(f)
        elif f.node_id in behind and f.layer == "communication":
            behind[f.node_id].folded.append(f"{f.rule_id} {f.node_id}")
            out.folded.append(f)
        elif job and (job in by_job or job in crossing) and not _rests_on(f, standing[node], layer_of):
            (by_job.get(job) or crossing[job]).folded.append(f"{f.rule_id} {f.node_id}")
            out.folded.append(f)
        elif (
            job
            and _judged(job, size, out.judgement, windows.ranks.node)
            and not _rests_on(f, standing[node], layer_of)
        ):
            shared.setdefault((job, f.layer), []).append(f)
        else:
            kept.append(f)
    slowed = _slowed(windows.x, windows.mask, job_of)
    for (job, layer), members in sorted(shared.items()):
        out.folded.extend(members)
        if 2 * len(members) >= size[job] and slowed.get(job, 1.0) >= SLOWED:
            finding, best = _shared_finding(job, layer, members, size[job], slowed[job])
            kept.append(finding)
            out.explain.append(best)
    out.explain += [f for f in kept if f.rule_id not in (JOB_RULE, SWITCH_RULE)]
    out.findings = kept + list(job_findings.values()) + switch_findings
    return out


def _judged(job: str, size: Mapping[str, int], judgement: JobJudgement, rank_nodes: np.ndarray) -> bool:
    """A job judged as a whole: MIN_RANKS nodes or more, or ranks on two nodes or more that the
    detector judged each against MIN_RANKS of the job's ranks on other nodes and itself (2 nodes of 8
    ranks: no node stands out of two, but 16 ranks with none holding the others back say the job's
    waits are its own). A job on one node is not: its node's fault holds all its ranks alike."""
    if size.get(job, 0) >= MIN_RANKS:
        return True
    members = judgement.judged.get(job, [])
    per_node = Counter(rank_nodes[members].tolist())
    return len(per_node) > 1 and all(len(members) - count + 1 >= MIN_RANKS for count in per_node.values())


def _rests_on(f: ModelFinding, standing: np.ndarray, layer_of: np.ndarray) -> bool:
    """Does the node stand apart from its peers in a feature of the finding's class? A finding whose
    class the node's own features do not set it apart in (a waiting peer read as communication while
    its disk runs warmer than its neighbours') is not the node's own."""
    return bool((standing & (layer_of == f.layer)).any())


def _slowed(x: np.ndarray, mask: np.ndarray, job_of: list[str]) -> dict[str, float]:
    """Per job: the median over its nodes of their step time's median in the last JOB_RECENT steps over
    that in the first BASELINE steps (jobs whose nodes sent too little: absent)."""
    step = np.where(mask[:, :, STEP_TIME] > 0, x[:, :, STEP_TIME].astype(np.float64), np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):  # a node without a step in either span
        ratio = nanmedian(step[:, -JOB_RECENT:], axis=1) / nanmedian(step[:, :BASELINE], axis=1)
    by_job: dict[str, list[float]] = {}
    for value, job in zip(ratio.tolist(), job_of, strict=True):
        if job and np.isfinite(value):
            by_job.setdefault(job, []).append(value)
    return {job: float(np.median(values)) for job, values in by_job.items()}


def _culprit_finding(found: list[Culprit], windows, node_ids: list[str]) -> ModelFinding:
    """One job's culprit ranks on one node: the finding names them all, in the words of the one that
    stands out most."""
    lead = max(found, key=lambda c: c.z)
    node = node_ids[lead.node]
    mine = sorted({c.rank for c in found}, key=_rank_order)
    held = sorted({windows.ranks.rank[i] for c in found for i in c.holds_back} - set(mine), key=_rank_order)
    computes, waits = ("computes longer", "waits longer for its input")
    who, verb, them = f"rank {mine[0]}", "slows", "its peers, who wait for it"
    if len(mine) > 1:
        computes, waits = ("compute longer", "wait longer for their input")
        who, verb, them = f"ranks {_rank_list(mine)}", "slow", "their peers, who wait for them"
    what = computes if lead.kind == "compute" else waits
    detail = (
        f"job {lead.job}: {who} on {node} {verb} {len(held)} ranks: {lead.layer} ({what}, "
        f"+{100 * lead.excess:.0f} % of the step; {100 * lead.waits_less:.0f} % less in the collective "
        f"than {them})"
    )
    weights = {
        COMPUTE_NAME: lead.excess if lead.kind == "compute" else 0.0,
        "train_data_wait_ms": lead.excess if lead.kind == "input" else 0.0,
        "train_allreduce_latency_ms": lead.waits_less,
    }
    from stethoscope.model.explain import shares

    return ModelFinding(
        JOB_RULE,
        node,
        lead.layer,
        lead.z / (lead.z + Z),
        lead.excess,
        SHARE,
        shares(np.array(list(weights.values())), list(weights)),
        path=node,
        detail=detail,
        job=lead.job,
        ranks=mine,
        held_back=held,
    )


def _rank_list(ranks: list[str]) -> str:
    """'0-7', '2, 5', '0-3, 6': runs of consecutive numeric ranks as ranges."""
    parts: list[str] = []
    run: list[int] = []
    for rank in [*ranks, ""]:
        if rank.isdigit() and run and int(rank) == run[-1] + 1:
            run.append(int(rank))
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [int(rank)] if rank.isdigit() else []
        if rank and not rank.isdigit():
            parts.append(rank)
    return ", ".join(parts)


def _rank_order(rank: str) -> tuple[int, str]:
    return (int(rank), "") if rank.isdigit() else (1 << 30, rank)


def _switch_finding(c: Congestion, node_ids: list[str]) -> ModelFinding:
    nodes = [node_ids[i] for i in c.nodes]
    jobs = []
    for j in c.jobs:
        change = "" if np.isnan(j.collective_change) else f", collective {100 * j.collective_change:+.0f} %"
        jobs.append(f"{j.job} ({j.behind} of its {j.nodes} nodes behind it{change})")
    detail = (
        f"switch {c.switch}: congestion: transmit waits x{c.rise:.1f} on {len(nodes)} of its {c.judged} "
        f"busy nodes; jobs crossing it: {', '.join(jobs) or 'none'}"
    )
    rise = float(np.log(c.rise))
    return ModelFinding(
        SWITCH_RULE,
        switch_id(c.switch),
        "communication",
        rise / (rise + RISE),
        c.rise,
        float(np.exp(RISE)),
        {"ib_port_xmit_wait_per_second": 100.0},
        path=ARROW.join([nodes[0], c.switch, nodes[1]]) if len(nodes) > 1 else c.switch,
        detail=detail,
        nodes=nodes,
        jobs=[j.job for j in c.jobs],
    )


def _shared_finding(
    job: str, layer: str, members: list[ModelFinding], size: int, slowed: float
) -> tuple[ModelFinding, ModelFinding]:
    first = sorted(members, key=lambda f: f.node_id)[0]
    best = max(members, key=lambda f: f.confidence)
    detail = (
        f"job {job}: {len(members)} of its {size} nodes read as {layer}, none apart from the others, "
        f"its step x{slowed:.2f} over the window: a cause its nodes share (its own traffic or input, "
        "the fabric, the file system)"
    )
    finding = ModelFinding(
        JOB_RULE,
        first.node_id,
        layer,
        best.confidence,
        best.value,
        best.threshold,
        best.explanation,
        path=first.node_id,
        detail=detail,
        job=job,
        folded=[f"{f.rule_id} {f.node_id}" for f in members],
    )
    return finding, best
