"""Fresh families (stethoscope.model.fresh): a clean hold-out for the shipped model, written after it
was trained and chosen. Format and determinism only: their scores are a benchmark
(benchmarks/model_fresh_families.py), not a test."""

from __future__ import annotations

import numpy as np
import pytest

from stethoscope.model import episodes, fresh
from stethoscope.model.metadata import CLASSES, FEATURES, STEPS

PER = 6


@pytest.fixture(scope="module")
def data() -> episodes.Episodes:
    return fresh.generate(seed=11, per_family=PER)


def test_fresh_families_reuse_no_training_family_name():
    assert not set(fresh.FRESH) & set(episodes.FAMILIES)
    assert not set(fresh.FRESH) & set(episodes.REPLAYED)
    assert not {name.split(".", 1)[1] for name in fresh.FRESH} & {
        name.split(".", 1)[1] for name in episodes.FAMILIES
    }


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
