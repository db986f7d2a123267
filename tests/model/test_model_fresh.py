"""Fresh families (stethoscope_training.fresh, set 14): the clean hold-out of generator version 13,
written before that model was trained. Format and determinism only: their scores are a benchmark
(benchmarks/model_fresh_families.py), not a test."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stethoscope.model.metadata import CLASSES, FEATURES, STEPS
from stethoscope_training import episodes, fresh

TOP = Path(__file__).resolve().parents[2]

PER = 6


@pytest.fixture(scope="module")
def data() -> episodes.Episodes:
    return fresh.generate(seed=11, per_family=PER)


def test_fresh_families_reuse_no_training_family_name():
    earlier = set(episodes.FAMILIES)
    assert not set(fresh.FRESH) & earlier
    assert not set(fresh.FRESH) & set(episodes.REPLAYED)
    assert not {name.split(".", 1)[1] for name in fresh.FRESH} & {name.split(".", 1)[1] for name in earlier}


def _scorings(fresh_set: int) -> list[dict]:
    """Every recorded scoring of a set: the benchmark's current file, the scorings from before runs
    wrote whole files, and the files beside them named for the set (each of which must be that
    set's)."""
    results = TOP / "benchmarks" / "results"
    doc = json.loads((results / "model_fresh_families.json").read_text())
    history = json.loads((results / "model_fresh_history.json").read_text())["scorings"]
    found = [e for e in [doc, *history] if e.get("fresh_set") == fresh_set]
    for name in (f"model_fresh_set{fresh_set}.json", f"model_fresh_set{fresh_set}_by_*.json"):
        for path in sorted(results.glob(name)):
            entry = json.loads(path.read_text())
            assert entry["fresh_set"] == fresh_set, path.name
            found.append(entry)
    return found


# set -> the generator versions of the models its recorded scorings were made with
SCORED_BY = {10: {10}, 11: {10}, 12: {10, 11}, 13: {11, 12}, 14: {12, 13}}


@pytest.mark.parametrize("fresh_set", sorted(SCORED_BY))
def test_a_scored_set_regenerates_the_data_its_scorings_recorded(fresh_set):
    """Sets 10 and 11 both scored the model of generator version 10 and are training data since
    version 11; set 12 scored version 11 (and, for comparison, version 10) and is training data since
    version 12; set 13 scored version 11 for comparison before version 12 was trained, then version
    12, and is training data since version 13; set 14 scored version 12 for comparison before
    version 13 was trained, then version 13. Regenerated, each gives the very data its scorings
    recorded: a family edited after its set was scored would make those figures another set's."""
    chosen = fresh.families_of(fresh_set)
    if fresh_set != fresh.SET:
        assert set(chosen) <= set(episodes.FAMILIES)
    scorings = _scorings(fresh_set)
    assert {s["generator_version"] for s in scorings} == SCORED_BY[fresh_set]
    again = fresh.generate(seed=2026, per_family=200, fresh_set=fresh_set)
    assert again.info["fresh_set"] == fresh_set and set(again.family.tolist()) == set(chosen)
    for recorded in scorings:
        assert (recorded["fresh_seed"], recorded["per_family"]) == (2026, 200)
        assert again.data_hash() == recorded["fresh_data_hash"]


def test_the_current_set_is_no_training_data_and_other_sets_are_named_by_number():
    assert fresh.SET == 14 and fresh.families_of(fresh.SET) is fresh.FRESH
    assert not set(fresh.FRESH) & set(episodes.FAMILIES)
    assert set(fresh.families_of(3)) <= set(episodes.FAMILIES)
    with pytest.raises(ValueError, match="fresh set 99"):
        fresh.families_of(99)


def test_every_class_has_a_fresh_family(data):
    for cls in CLASSES:
        assert any(c == cls for c, _ in fresh.FRESH.values()), cls
    assert set(data.label.tolist()) == set(range(len(CLASSES)))


def test_arrays_have_the_episode_format(data):
    n = len(fresh.FRESH) * PER
    assert data.x.shape == data.mask.shape == (n, STEPS, len(FEATURES))
    assert data.x.dtype == data.mask.dtype == np.float32
    assert data.label.dtype == data.onset.dtype == np.int64
    assert data.severity.dtype == np.float32
    assert data.family.dtype == np.dtype("<U64") and data.split.dtype == np.dtype("<U16")
    assert data.hw_class.dtype == np.dtype("<U32")
    assert set(data.split.tolist()) == {"fresh"}
    assert np.array_equal(np.isnan(data.x), data.mask == 0)
    assert set(np.unique(data.mask).tolist()) <= {0.0, 1.0}


def test_labels_onsets_and_severities_follow_the_family(data):
    for name, (cls, _) in fresh.FRESH.items():
        members = data.family == name
        assert members.sum() == PER
        assert (data.label[members] == CLASSES.index(cls)).all()
        if cls == "healthy":
            assert (data.onset[members] == -1).all() and (data.severity[members] == 0).all()
        else:
            assert ((data.onset[members] >= 0) & (data.onset[members] < STEPS)).all()
            assert ((data.severity[members] > 0) & (data.severity[members] <= 1)).all()


def test_same_seed_gives_identical_arrays_other_seed_does_not(data):
    again = fresh.generate(seed=11, per_family=PER)
    for name in episodes.ARRAYS:
        a, b = getattr(again, name), getattr(data, name)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    assert again.data_hash() == data.data_hash() == data.info["data_hash"]
    assert fresh.generate(seed=12, per_family=PER).data_hash() != data.data_hash()


def test_fresh_generation_leaves_the_training_data_unchanged():
    before = episodes.generate(seed=7, per_family=3).data_hash()
    fresh.generate(seed=7, per_family=3)
    assert episodes.generate(seed=7, per_family=3).data_hash() == before


def test_bad_per_family_is_refused():
    with pytest.raises(episodes.EpisodesError):
        fresh.generate(seed=1, per_family=0)


def test_stand_in_peers_run_the_episodes_own_workload():
    """Regression guard: set 1's small-batch and partial-node jobs were compared with peers running
    a standard training job, so the outlier detector fired on a third of them; a job's ranks run one
    workload, so a healthy workload family's stand-in peers come from that family."""
    from stethoscope_training import evaluate

    eps = episodes.generate(seed=5, per_family=8)
    index = np.arange(len(eps))
    groups = np.asarray(evaluate.peer_groups(eps, index))
    small = eps.family == "healthy.small_batch"
    peers_of_small = set(eps.family[np.isin(groups, groups[small]) & (eps.label == 0)])
    assert peers_of_small == {"healthy.small_batch"}
    standard = eps.family == "healthy.training"
    peers_of_standard = set(eps.family[np.isin(groups, groups[standard]) & (eps.label == 0)])
    assert "healthy.small_batch" not in peers_of_standard and "healthy.training" in peers_of_standard


def test_a_workload_no_other_episode_can_stand_in_for_gets_no_outlier_score():
    """Regression guard: stand-in peers for a job whose GPU load swings, or whose pace changes at its
    own step, are other episodes with other swings: their gaps raised the detector's threshold
    chosen on healthy validation episodes (3.9 -> 5.8) until a rank 1000x over its lockstep peers'
    xmit wait no longer stood out. Such episodes are now left unscored."""
    from stethoscope_training import evaluate, families

    eps = episodes.generate(seed=5, per_family=8)
    groups = evaluate.peer_groups(eps, np.arange(len(eps)))
    for name, kind in families.WORKLOADS.items():
        members = [g for g, f in zip(groups, eps.family, strict=True) if f == name]
        if kind is None and members:
            assert len(set(members)) == len(members), name  # each its own group: no peers
    swinging = np.flatnonzero(eps.family == "healthy.periodic_load")
    xn = np.nan_to_num(eps.x).astype(np.float32)
    _, peer_mask = evaluate.peer_windows(xn, eps.mask, groups, eps.label == 0, seed=1)
    assert (peer_mask[swinging] == 0).all()


def test_every_workload_tag_names_a_family_that_exists():
    """A misspelt name in families.WORKLOADS would fall back to "standard" without a word."""
    from stethoscope_training import families

    known = set(episodes.FAMILIES) | set(fresh.FRESH)
    assert set(families.WORKLOADS) <= known, set(families.WORKLOADS) - known
    assert all(name.startswith("healthy.") for name in families.WORKLOADS)


def test_rules_miss_recall_counts_jobs_that_send_their_timings_and_the_others_apart():
    """Regression guard: with a share of jobs sending their step time alone, an AllReduce centre in
    such a job shows nothing a slow disk would not; its misses are reported apart, not hidden in the
    family's recall."""
    from stethoscope_training import evaluate

    n = 4
    labels = np.full(n, CLASSES.index("communication"))
    families = np.full(n, "communication.allreduce_centre")
    pred = np.array([1, 1, 1, 0])  # the last one, a job sending its step time only, is missed
    out = evaluate.Outputs(
        probs=np.zeros((n, len(CLASSES)), np.float32),
        pred=pred,
        score=np.full(n, np.nan),
        deviation=np.zeros((n, len(FEATURES)), np.float32),
        outlier=np.zeros(n, dtype=bool),
        outlier_layer=np.zeros(n, dtype=int),
    )
    timed = np.array([True, True, True, False])
    found = evaluate.score_outputs(out, labels, families, timed)["rules_miss"][
        "communication.allreduce_centre"
    ]
    assert found["recall"] == 1.0 and found["episodes"] == 3
    assert found["step_time_only"] == {"episodes": 1, "recall": 0.0}
    mask = np.ones((2, STEPS, len(FEATURES)), np.float32)
    mask[1, :, [FEATURES.index(f) for f in FEATURES if f.metric in evaluate.TIMINGS]] = 0
    assert evaluate.reports_timings(mask).tolist() == [True, False]


def test_detector_precision_is_unknown_where_no_healthy_episode_could_lower_it():
    """Fresh set 11's healthy families all run workloads no stand-in peer can run: the detector
    scored none of them, and its precision read 1.0 though no healthy window could have lowered it."""
    from stethoscope_training import evaluate

    labels = np.array([0, 0, 1, 1])
    families = np.array(["healthy.a", "healthy.a", "communication.b", "communication.b"])

    def outputs(score, outlier):
        n = len(labels)
        return evaluate.Outputs(
            probs=np.zeros((n, len(CLASSES)), np.float32),
            pred=labels.copy(),
            score=np.asarray(score, dtype=float),
            deviation=np.zeros((n, len(FEATURES)), np.float32),
            outlier=np.asarray(outlier, dtype=bool),
            outlier_layer=labels.copy(),
        )

    unjudged = evaluate.score_outputs(outputs([np.nan, np.nan, 9.0, 1.0], [0, 0, 1, 0]), labels, families)
    assert unjudged["outlier"]["precision"] is None and unjudged["outlier"]["healthy_scored"] == 0
    assert "precision unknown (no healthy episode scored)" in evaluate.render(unjudged)
    silent = evaluate.score_outputs(outputs([1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]), labels, families)
    assert silent["outlier"]["precision"] is None  # it never fired
    assert "precision unknown (it never fired)" in evaluate.render(silent)
    judged = evaluate.score_outputs(outputs([1.0, 9.0, 9.0, 1.0], [0, 1, 1, 0]), labels, families)
    assert judged["outlier"]["precision"] == 0.5 and judged["outlier"]["healthy_scored"] == 2
