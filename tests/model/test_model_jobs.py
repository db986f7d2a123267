"""Diagnosis that understands synchronous jobs: the job-relative detector names the rank
that holds a job back and the switch that congests the jobs crossing it, and the graphs' findings on
the peers that only wait are folded into that one finding. Scenes from stethoscope_training/jobs.py
(ranks' times from how a synchronous step runs, node signals calibrated on the real H200 capture),
read back from a real embedded store where the read is what is tested."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stethoscope.model.features import read_windows
from stethoscope.model.findings import from_windows, read_topology
from stethoscope.model.inference import graphs_for
from stethoscope.model.jobs import judge_jobs
from stethoscope.model.metadata import STEPS, load, metadata_path
from stethoscope.model.ranks import Ranks
from stethoscope.store.batch import MetricColumns
from stethoscope_training import job_fresh
from stethoscope_training.episodes import hardware
from stethoscope_training.jobs import Options, Scene, simulate

END_MS = 1_798_761_600_000
H200 = json.dumps({"gpu": {"models": ["NVIDIA H200"], "count": 8}})


@pytest.fixture(scope="module")
def graphs():
    return graphs_for(load(metadata_path()))


def _scene(kind: str, seed: int, **options) -> Scene:
    _, _, hw = hardware("h200", 1)
    return simulate(np.random.default_rng(seed), hw, kind, f"test.{kind}", Options(**options))


def _own_findings(scene: Scene, findings, nodes) -> list:
    names = {scene.node_ids[n] for n in nodes}
    return [f for f in findings if f.node_id in names and f.rule_id != "model.job"]


@pytest.mark.parametrize("kind,layer", [("straggler", "compute"), ("input_stall", "storage")])
def test_the_culprit_rank_is_named_and_its_waiting_peers_get_no_finding(graphs, kind, layer) -> None:
    scene = _scene(kind, 3, severity=(0.3, 0.3), onset=(30, 31), sizes=(16,), size_weights=(1.0,))
    truth = scene.truth
    run = from_windows(graphs, scene.windows(), scene.topology)
    named = [f for f in run.findings if f.rule_id == "model.job"]
    assert [(f.job, f.ranks, f.layer) for f in named] == [(truth["job"], [truth["rank"]], layer)]
    culprit = scene.node_ids[truth["node"]]
    assert named[0].node_id == culprit
    assert named[0].detail.startswith(
        f"job {truth['job']}: rank {truth['rank']} on {culprit} slows 15 ranks: {layer}"
    )
    assert _own_findings(scene, run.findings, truth["peers"]) == []
    # the graphs alone read the waiting peers as faults: why the job-relative detector exists
    alone = from_windows(graphs, scene.windows(), scene.topology, relative=False)
    assert len(_own_findings(scene, alone.findings, truth["peers"])) >= 4


def test_congestion_is_the_switch_s_naming_the_jobs_crossing_it(graphs) -> None:
    scene = _scene("switch_congestion", 5, onset=(40, 41), ramp=(10, 11), waits=(20.0, 20.0))
    truth = scene.truth
    run = from_windows(graphs, scene.windows(), scene.topology)
    switches = [f for f in run.findings if f.rule_id == "model.switch"]
    assert [f.node_id for f in switches] == [f"switch:{truth['switch']}"]
    assert set(switches[0].jobs) == set(truth["crossing"])
    assert switches[0].detail.startswith(f"switch {truth['switch']}: congestion: transmit waits x")
    crossing = [n for n, job in enumerate(scene.job) if job in truth["crossing"]]
    assert _own_findings(scene, run.findings, crossing) == []
    assert truth["switch"] in run.switches  # its finding resolves once the switch is judged clear


def test_healthy_fleets_get_no_job_or_switch_finding(graphs) -> None:
    for seed in range(4):
        scene = _scene("healthy", 100 + seed, lifecycle=0.6, checkpoint=0.6)
        run = from_windows(graphs, scene.windows(), scene.topology)
        assert [
            f.detail or f.rule_id for f in run.findings if f.rule_id in ("model.job", "model.switch")
        ] == []


def _ranks(step, comm, data) -> Ranks:
    count = len(step)
    x = np.zeros((count, STEPS, 3), np.float32)
    x[:, :, 0], x[:, :, 1], x[:, :, 2] = (np.asarray(v, np.float32)[:, None] for v in (step, comm, data))
    return Ranks(["1"] * count, [str(r) for r in range(count)], np.arange(count), x, np.ones_like(x))


def test_a_rank_that_computes_longer_but_waits_as_long_as_the_others_holds_no_one_back() -> None:
    # rank 0's step is as long as its peers', and it waits in the collective as they do: whatever it
    # computes longer, it spends less on input; no one waits for it
    step, comm = [400.0] * 6, [60.0] * 6
    data = [10.0, 40.0, 40.0, 40.0, 40.0, 40.0]
    assert judge_jobs(_ranks(step, comm, data)).culprits == []
    # and the straggler: it computes 40 ms longer, the others wait 40 ms longer for it
    comm = [60.0, 100.0, 100.0, 100.0, 100.0, 100.0]
    data = [10.0] * 6
    (culprit,) = judge_jobs(_ranks(step, comm, data)).culprits
    assert (culprit.rank, culprit.kind, len(culprit.holds_back)) == ("0", "compute", 5)


def test_each_rank_reads_back_from_the_store_as_the_scene_s_windows(store) -> None:
    scene = _scene(
        "straggler", 11, severity=(0.3, 0.3), sizes=(4, 8), size_weights=(0.5, 0.5), switches=(2, 2)
    )
    store.insert_metrics(MetricColumns.from_rows(scene.to_rows(END_MS)))
    store.insert_rows("nodes", scene.nodes_rows(END_MS))
    read = read_windows(store, END_MS)
    want = scene.windows()
    position = [read.node_ids.index(n) for n in want.node_ids]
    np.testing.assert_array_equal(read.mask[position], want.mask)
    np.testing.assert_allclose(read.x[position], want.x, rtol=1e-6)
    assert [read.job[i] for i in position] == want.job
    order = {(j, r): i for i, (j, r) in enumerate(zip(read.ranks.job, read.ranks.rank, strict=True))}
    mine = [order[(j, r)] for j, r in zip(want.ranks.job, want.ranks.rank, strict=True)]
    assert [read.node_ids[read.ranks.node[i]] for i in mine] == [want.node_ids[n] for n in want.ranks.node]
    np.testing.assert_array_equal(read.ranks.mask[mine], want.ranks.mask)
    np.testing.assert_allclose(read.ranks.x[mine], want.ranks.x, rtol=1e-6)
    assert read_topology(store, read.node_ids) == {n: scene.topology[n] for n in read.node_ids}


def test_diagnose_words_the_job_and_switch_findings_and_never_drains_a_switch(store) -> None:
    from stethoscope.diagnosis.findings import diagnose
    from stethoscope.diagnosis.model_findings import ModelUse

    at = END_MS
    for kind, seed, prefix in (("straggler", 3, "a-"), ("switch_congestion", 5, "b-")):
        scene = _scene(
            kind, seed, severity=(0.3, 0.3), onset=(40, 41), ramp=(10, 11), waits=(20.0, 20.0), prefix=prefix,
            job_ids=(1000, 5000) if prefix == "a-" else (5000, 9000), sizes=(16,), size_weights=(1.0,),
        )  # fmt: skip
        _store_scene(store, scene, at)
        if kind == "straggler":
            truth = scene.truth
        else:
            switch = scene.truth["switch"]
    found = diagnose(store, [], at + 1, model=ModelUse(load(metadata_path()), level="L4"))
    job = [f for f in found if f["rule_id"] == "model.job"]
    assert len(job) == 1 and job[0]["level"] == "L4"
    assert f"model core12: job {truth['job']}: rank {truth['rank']} on " in job[0]["message"]
    assert "folded in" in job[0]["message"]  # the graphs' findings on its waiting peers
    (congested,) = [f for f in found if f["rule_id"] == "model.switch"]
    assert congested["node_id"] == f"switch:{switch}" and congested["level"] == "L2"  # no host to drain
    assert congested["nodes"] and all(n.startswith("b-") for n in congested["nodes"])


def _store_scene(store, scene: Scene, at: int) -> None:
    store.insert_metrics(MetricColumns.from_rows(scene.to_rows(at)))
    store.insert_rows("nodes", scene.nodes_rows(at))
    store.insert_rows(
        "fingerprints",
        [
            {"fingerprint": "h200", "kind": "class", "node_id": n, "detail": H200, "first_seen": 0}
            for n in scene.node_ids
        ],
    )


def test_a_switch_s_finding_is_the_switch_s_not_a_node_named_after_it(store) -> None:
    """Regression: model.switch took the bare switch name for its node_id, so the board showed a node
    row named after the switch, /metrics counted it as a node and an incident could take it for a
    host's; the rules' correlated findings say `switch:<name>`, and so does it now."""
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.findings import diagnose
    from stethoscope.diagnosis.model_findings import ModelUse
    from stethoscope.remediation.incidents import keeps_own
    from stethoscope.report.board import collect

    scene = _scene("switch_congestion", 5, onset=(40, 41), ramp=(10, 11), waits=(20.0, 20.0))
    _store_scene(store, scene, END_MS)
    switch = scene.truth["switch"]
    use = ModelUse(load(metadata_path()))
    found = diagnose(store, [], END_MS + 1, model=use)
    (congested,) = [f for f in found if f["rule_id"] == "model.switch"]
    assert congested["node_id"] == f"switch:{switch}"
    assert keeps_own(congested["rule_id"], congested["node_id"])  # never joins a host's incident
    assert f"switch:{switch}" in use.evaluated  # judged clear in a later cycle, its finding resolves
    behind = congested["nodes"]
    assert behind and all(scene.switch[scene.node_ids.index(n)] == switch for n in behind)

    def marked(board) -> dict[str, list[str]]:
        rows = {n.node_id: n for n in board.nodes}
        assert switch not in rows and f"switch:{switch}" not in rows  # no row for the switch
        return {
            n: [note for c in rows[n].cells.values() for note in c.notes if "model.switch" in note]
            for n in behind
        }

    catalog = Catalog.load()
    today = marked(collect(store, catalog, 1, END_MS + 1, [], today=found))
    assert all(today.values())  # shown on each node behind the switch, as the rules' correlated
    row = {k: congested[k] for k in ("finding_id", "rule_id", "node_id", "device", "severity", "level")}
    store.insert_rows(
        "findings",
        [
            {
                **row,
                "txn_id": "t1",
                "confidence": congested["confidence"],
                "message": congested["message"],
                "evidence": congested["evidence"],
                "first_seen": END_MS,
                "last_seen": END_MS,
                "status": "open",
                "version": 1,
            }
        ],
    )
    stored = marked(collect(store, catalog, 1, END_MS + 1, [], evaluate=False))
    assert all(stored.values())  # stored, it is shown so too


def _ranks_on(nodes: list[int], step, comm, data) -> Ranks:
    count = len(nodes)
    x = np.zeros((count, STEPS, 3), np.float32)
    x[:, :, 0], x[:, :, 1], x[:, :, 2] = (np.asarray(v, np.float32)[:, None] for v in (step, comm, data))
    return Ranks(["1"] * count, [str(r) for r in range(count)], np.asarray(nodes), x, np.ones_like(x))


def test_an_input_stall_on_every_rank_of_one_node_of_a_2x8_job_is_that_node_s() -> None:
    """Regression: a job runs 8 ranks a node. When every rank of one node of a 2x8 job waits for its
    input, half the job's ranks stand out: measured against all the ranks (the median fell between
    the two nodes) and counted in ranks (8 of 16, more than a quarter) they were no culprit."""
    nodes = [0] * 8 + [1] * 8
    step = [400.0] * 16
    data = [50.0] * 8 + [10.0] * 8  # node 0's ranks wait 40 ms longer for their input
    comm = [60.0] * 8 + [100.0] * 8  # and node 1's wait 40 ms longer for them in the collective
    culprits = judge_jobs(_ranks_on(nodes, step, comm, data)).culprits
    assert [(c.rank, c.node, c.kind) for c in culprits] == [(str(r), 0, "input") for r in range(8)]
    assert all(sorted(c.holds_back) == list(range(8, 16)) for c in culprits)
    # one GPU that computes longer among its node's ranks is its rank alone
    comm = [100.0] * 3 + [60.0] + [100.0] * 12
    data = [10.0] * 16
    (straggler,) = judge_jobs(_ranks_on(nodes, step, comm, data)).culprits
    assert (straggler.rank, straggler.kind, len(straggler.holds_back)) == ("3", "compute", 15)
    # more than a quarter of one node's ranks, not all of them, computing longer: pipeline stages
    comm = [60.0] * 3 + [100.0] * 5
    assert judge_jobs(_ranks_on([0] * 8, [400.0] * 8, comm, [10.0] * 8)).culprits == []


def test_a_node_s_stalled_ranks_are_one_finding_naming_them(graphs) -> None:
    """Regression: each culprit rank was a finding of its own, all with the node's one finding id, so
    a node whose 8 ranks stall wrote 8 rows of one finding in one cycle."""
    scene = _scene(
        "input_stall", 3, severity=(0.3, 0.3), onset=(30, 31), sizes=(2,), size_weights=(1.0,),
        ranks_per_node=(8, 8), switches=(2, 2), per_switch=(8,),
    )  # fmt: skip
    truth = scene.truth
    culprit = scene.node_ids[truth["node"]]
    mates = [r for r, n in enumerate(scene.rank_node) if n == truth["node"]]
    assert truth["ranks"] == [scene.rank_label[r] for r in mates] and len(mates) == 8
    run = from_windows(graphs, scene.windows(), scene.topology)
    named = [f for f in run.findings if f.rule_id == "model.job"]
    assert [(f.node_id, f.job, f.ranks, f.layer) for f in named] == [
        (culprit, truth["job"], truth["ranks"], "storage")
    ]
    first, last = truth["ranks"][0], truth["ranks"][-1]
    assert named[0].detail.startswith(f"job {truth['job']}: ranks {first}-{last} on {culprit} slow 8 ranks")
    assert len(named[0].held_back) == 8 and not set(named[0].held_back) & set(truth["ranks"])
    assert _own_findings(scene, run.findings, truth["peers"]) == []


def test_in_jobs_of_several_ranks_a_node_the_straggler_rank_is_named_alone(graphs) -> None:
    scene = _scene(
        "straggler", 4, severity=(0.3, 0.3), onset=(30, 31), sizes=(4,), size_weights=(1.0,),
        ranks_per_node=(2, 8), switches=(2, 2), per_switch=(8,),
    )  # fmt: skip
    truth = scene.truth
    per_node = np.bincount(scene.rank_node)
    assert per_node.max() >= 2  # the generator places several ranks on a node
    run = from_windows(graphs, scene.windows(), scene.topology)
    named = [f for f in run.findings if f.rule_id == "model.job"]
    culprit = scene.node_ids[truth["node"]]
    assert [(f.node_id, f.job, f.ranks, f.layer) for f in named] == [
        (culprit, truth["job"], [truth["rank"]], "compute")
    ]
    assert _own_findings(scene, run.findings, truth["peers"]) == []


def test_healthy_fleets_of_several_ranks_a_node_get_no_job_or_switch_finding(graphs) -> None:
    for seed in range(4):
        scene = _scene("healthy", 200 + seed, lifecycle=0.6, checkpoint=0.6, ranks_per_node=(2, 8))
        run = from_windows(graphs, scene.windows(), scene.topology)
        assert [
            f.detail or f.rule_id for f in run.findings if f.rule_id in ("model.job", "model.switch")
        ] == []


def test_the_job_hold_out_is_the_set_recorded_before_the_change_it_scores() -> None:
    """jobs-2's scenes are the ones whose hash was recorded when the set was written: a change to the
    simulation that moved them would quietly swap the hold-out for a set nobody wrote down."""
    assert job_fresh.SET == job_fresh.SET_2
    assert job_fresh.scenes(2026, 40).data_hash() == job_fresh.DATA_HASH_2


def test_a_rank_whose_median_input_wait_lies_high_by_chance_is_no_culprit() -> None:
    # jobs waiting 5-30 % of the step for input, widely varying step to step: with the ranks'
    # medians close together by chance, a MAD-based z alone named a rank in 9 of these 40 fleets
    named = []
    for seed in range(300, 340):
        scene = _scene("healthy", seed, data_share=(0.05, 0.3), data_sigma=0.7)
        named += [(seed, c.job, c.rank) for c in judge_jobs(scene.windows().ranks).culprits]
    assert len(named) <= 2, named


def test_a_job_of_two_nodes_of_eight_ranks_waiting_together_gets_no_communication_finding(graphs) -> None:
    # no node stands out of two, but the 16 ranks the detector judged hold none back: the graphs'
    # communication findings on both nodes (in 8 of these 10 fleets before) are the job's own waits
    for seed in range(400, 410):
        scene = _scene("healthy", seed, ranks_per_node=(8, 8), sizes=(2, 4, 8), size_weights=(0.5, 0.3, 0.2))
        run = from_windows(graphs, scene.windows(), scene.topology)
        assert [f.node_id for f in run.findings if f.layer == "communication"] == [], seed


def test_a_stall_on_a_job_of_one_node_of_eight_ranks_stays_that_node_s_finding(graphs) -> None:
    # one node holds all the job's ranks: its stall holds them alike, so no rank stands out and the
    # graphs' storage finding is the node's, not a job's shared state ("1 of its 1 nodes") as before
    for seed in (500, 502, 503):  # 501: the graphs see no fault on it, before or after
        scene = _scene(
            "input_stall",
            seed,
            sizes=(1, 4),
            size_weights=(0.5, 0.5),
            ranks_per_node=(8, 8),
            fault_job_sizes=(1,),
            severity=(0.5, 1.0),
            onset=(20, 30),
        )
        node = scene.node_ids[scene.truth["node"]]
        run = from_windows(graphs, scene.windows(), scene.topology)
        assert [(f.rule_id, f.layer) for f in run.findings if f.node_id == node] == [
            ("model.storage", "storage")
        ], seed
