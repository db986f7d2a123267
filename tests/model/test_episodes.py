"""The learned diagnosis's training data: format, determinism, held-out families, calibration."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from stethoscope.model.metadata import CLASSES, FEATURES, STEPS
from stethoscope_training import episodes, families

TOP = Path(__file__).resolve().parents[2]
F = {f.metric: i for i, f in enumerate(FEATURES)}


@pytest.fixture(scope="module")
def data() -> episodes.Episodes:
    return episodes.generate(seed=7, per_family=30)


def test_arrays_have_the_contracts_shapes_and_types(data):
    n = (len(episodes.FAMILIES) + len(episodes.REPLAYED_TRAINING) + len(episodes.REPLAYED)) * 30
    assert data.x.shape == data.mask.shape == (n, STEPS, len(FEATURES))
    assert data.x.dtype == data.mask.dtype == np.float32
    assert data.label.dtype == data.onset.dtype == np.int64
    assert data.severity.dtype == np.float32
    assert data.family.dtype == np.dtype("<U64") and data.split.dtype == np.dtype("<U16")
    assert data.hw_class.dtype == np.dtype("<U32")
    assert set(data.split) == {"train", "validation", "test"}
    assert set(data.label) == set(range(len(CLASSES)))


def test_gaps_are_nan_and_masked_never_zero_filled(data):
    assert np.array_equal(np.isnan(data.x), data.mask == 0)
    idle = data.family == "healthy.idle"
    assert (data.mask[idle][:, :, F["train_step_time_ms"]] == 0).all()  # no job, no job metrics


def test_same_seed_gives_identical_arrays_and_hash_other_seed_does_not(data):
    again = episodes.generate(seed=7, per_family=30)
    for name in episodes.ARRAYS:
        a, b = getattr(again, name), getattr(data, name)
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), name
    assert again.data_hash() == data.data_hash() == data.info["data_hash"]
    assert episodes.generate(seed=8, per_family=30).data_hash() != data.data_hash()


def test_held_out_families_never_reach_train_or_validation(data):
    test_families = set(data.family[data.split == "test"])
    seen = set(data.family[data.split != "test"])
    assert not test_families & seen
    for cls in CLASSES[1:]:
        assert any(f.startswith(cls + ".") for f in episodes.HELD_OUT)
        assert any(f.startswith(cls + ".") for f in test_families)
    assert set(episodes.REPLAYED) <= test_families
    assert data.info["families_per_split"]["test"] == sorted(test_families)


def test_faults_rules_miss_are_there_and_look_normal_on_the_node(data):
    healthy = data.family == "healthy.training"
    centre = data.family == "communication.allreduce_centre"
    late = slice(STEPS - 10, STEPS)
    for name in ("pcie_aer_correctable_errors_per_second", "rdma_qps_dropped_per_second"):
        assert np.nanmax(data.x[centre][:, late, F[name]]) <= 0.4  # no error storm on its own node
    early = slice(0, 10)  # before every onset (faults start at step 20 or later)

    def growth(members, metric):  # per episode: its late level over its own early level
        x = data.x[members][:, :, F[metric]]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # jobs that report the step time only
            return np.nanmedian(np.nanmedian(x[:, late], axis=1) / np.nanmedian(x[:, early], axis=1))

    assert growth(centre, "train_allreduce_latency_ms") > 1.5
    assert growth(healthy, "train_allreduce_latency_ms") < 1.1
    nvme = data.family == "storage.slow_nvme_clean_smart"
    assert growth(nvme, "train_data_wait_ms") > 5 * growth(healthy, "train_data_wait_ms")
    straggler = data.family == "compute.straggler_gpu"
    assert np.nanmedian(data.x[straggler][:, late, F["gpu_sm_clock_mhz"]]) < np.nanmedian(
        data.x[healthy][:, late, F["gpu_sm_clock_mhz"]]
    )


def test_healthy_load_is_calibrated_on_the_real_capture_power_cap_included(data):
    capture = episodes.Capture.read()
    h200 = capture.h200()
    assert 680 < h200.cap_power < 700 and 1400 < h200.load_clock < 1500 and 75 < h200.idle_power < 85
    load = data.family == "healthy.training"
    per_gpu = np.nanmedian(data.x[load][:, :, F["gpu_power_watts"]]) / episodes.GPUS
    assert abs(per_gpu - h200.cap_power) < 10
    replay = data.family == "healthy.replay_load"
    clocks = set(np.unique(data.x[replay][:, :, F["gpu_sm_clock_mhz"]][data.mask[replay][:, :, 2] > 0]))
    assert clocks <= set(capture.load[:, 2])  # the minimum of the capture's own samples


def test_shifted_class_has_its_own_ranges():
    shifted = episodes.generate(seed=7, per_family=10, hw_class="shifted")
    load = shifted.family == "healthy.training"
    assert set(shifted.hw_class) == {"synthetic next-gen"}
    assert np.nanmedian(shifted.x[load][:, :, F["gpu_power_watts"]]) / episodes.GPUS > 950


def test_saved_episodes_load_back_and_a_damaged_file_is_refused(data, tmp_path):
    episodes.save(data, tmp_path)
    back = episodes.load(tmp_path)
    assert back.data_hash() == data.data_hash()
    with np.load(tmp_path / "episodes.npz") as npz:
        arrays = {k: npz[k] for k in episodes.ARRAYS}
    arrays["label"] = arrays["label"][::-1].copy()
    np.savez_compressed(tmp_path / "episodes.npz", **arrays)
    with pytest.raises(episodes.EpisodesError, match="data hash"):
        episodes.load(tmp_path)
    with pytest.raises(episodes.EpisodesError, match="no such file"):
        episodes.load(tmp_path / "absent")


def test_lab_episodes_command_writes_npz_and_json(tmp_path):
    out = tmp_path / "ep"
    done = subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "episodes", "--out", str(out), "--per-family", "5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "episodes.json").read_text())
    assert info["seed"] == 7 and info["generator_version"] == episodes.GENERATOR_VERSION
    assert set(info["per_family"]) == {*episodes.FAMILIES, *episodes.REPLAYED_TRAINING, *episodes.REPLAYED}
    assert episodes.load(out).data_hash() == info["data_hash"]
    bad = subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "episodes", "--out", str(out), "--hw-class", "b300"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "hw-class" in bad.stderr


def test_a_missing_or_damaged_capture_is_named_not_a_traceback(tmp_path):
    with pytest.raises(episodes.EpisodesError, match="cannot read the H200 capture"):
        episodes.Capture.read(tmp_path / "absent.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("index, timestamp\n0, 2026/11/29, x\n")
    with pytest.raises(episodes.EpisodesError, match=r"bad\.csv:2: not a --query-gpu row"):
        episodes.Capture.read(bad)


def test_jobs_that_report_only_their_step_time_are_in_the_training_data(data):
    """Regression guard: Reporter.step() sends comm/data times only when given; the first fresh
    hold-out showed healthy jobs unlike the training ones read as faults, and no training episode
    had a step time without the other two."""
    job = (data.mask[:, :, F["train_step_time_ms"]] > 0).any(axis=1)
    timed = (data.mask[:, :, F["train_allreduce_latency_ms"]] > 0).any(axis=1)
    waited = (data.mask[:, :, F["train_data_wait_ms"]] > 0).any(axis=1)
    assert np.array_equal(timed, waited)
    trained = data.split == "train"
    share = float((job & ~timed)[trained].sum()) / float(job[trained].sum())
    assert 0.05 < share < 0.3, share
    for cls in range(len(CLASSES)):
        assert (job & ~timed & (data.label == cls)).any(), CLASSES[cls]


def test_earlier_fresh_sets_and_healthy_variety_are_training_families_now(data):
    """Regression guard: fresh sets 1-12 found healthy workloads the training data lacked (small
    batches, an inference server, part of a node, swinging GPU load, a change of pace, routine
    checkpoint saves, a job restart, an epoch boundary, a profiler, gradient accumulation, a
    checkpoint upload, a shared leaf's traffic spells, an async local checkpoint) read as faults,
    a memory-bound straggler GPU and a drive's PCIe link errors as communication faults, an HCA
    firmware hang as healthy, a parallel file system's client eviction as healthy and a host CPU
    PROCHOT as communication or storage; once scored, a hold-out becomes training data and the next
    set is the hold-out."""
    import importlib

    from stethoscope_training import families_healthy_variety, fresh

    added_sets = [
        getattr(importlib.import_module(f"stethoscope_training.retired_holdouts.set{n:02d}"), f"SET{n}")
        for n in range(1, 14)
    ]
    for added in (*added_sets, families_healthy_variety.HEALTHY_VARIETY):
        assert set(added) <= set(episodes.FAMILIES)
    assert not set(fresh.FRESH) & set(episodes.FAMILIES)
    trained = set(data.family[data.split == "train"])
    assert {
        "healthy.small_batch",
        "healthy.inference_server",
        "healthy.partial_node",
        "healthy.pipeline_bubbles",
        "healthy.phase_change",
        "healthy.checkpoint_saves",
        "healthy.job_restart",
        "compute.memory_bound_straggler",
        "healthy.epoch_boundary",
        "storage.nvme_link_errors",
        "healthy.profiler_stretch",
        "communication.nic_affinity_after_restart",
        "healthy.gradient_accumulation",
        "healthy.checkpoint_upload",
        "healthy.periodic_gc_pauses",
        "communication.rank_on_slow_peer",
        "healthy.shared_leaf_bursts",
        "communication.hca_firmware_hang",
        "compute.host_cpu_prochot",
        "storage.parallel_fs_client_eviction",
        "healthy.moe_all_to_all_variance",
        "compute.host_memory_ce_storm",
    } <= trained
    assert data.info["generator_version"] == episodes.GENERATOR_VERSION == 13


def test_step_times_cover_small_and_large_batches(data):
    steps = data.x[:, :, F["train_step_time_ms"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # episodes without a job: all NaN
        typical = np.nanmedian(steps, axis=1)  # raw milliseconds
    assert np.nanmin(typical) < 60 and np.nanmax(typical) > 3000


def test_every_class_counts_a_harmless_aer_trickle_in_some_episodes(data):
    """Fresh set 5: a drive whose PCIe link took correctable errors read as a communication fault,
    since in training only communication faults counted AER. Now a share of every class's episodes,
    healthy ones included, counts a trickle."""
    aer = data.x[:, :, F["pcie_aer_correctable_errors_per_second"]]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        counting = np.nansum(aer >= 0.2, axis=1) >= 10  # a healthy node's stray error is one step
    for cls in range(len(CLASSES)):
        share = float(counting[data.label == cls].mean())
        assert share > 0.03, (CLASSES[cls], share)
    healthy = (data.label == 0) & counting
    assert np.nanmax(aer[healthy]) <= 10, "a trickle, not a storm"


def test_composed_healthy_episodes_combine_two_to_four_benign_changes(monkeypatch):
    """Fresh sets found healthy work the model read as a fault whenever two benign changes came
    together; each composed episode takes two to four of them, each applied to its episodes only."""
    from stethoscope_training import families_composed

    touched = np.zeros((40, len(families_composed.CHANGES)), dtype=int)

    def recording(k, change):
        def wrapped(part):
            touched[part.noise[:, 0].astype(int), k] += 1  # marked below with the episode's index
            change(part)

        return wrapped

    monkeypatch.setattr(
        families_composed,
        "CHANGES",
        tuple(recording(k, c) for k, c in enumerate(families_composed.CHANGES)),
    )
    base = families_composed.healthy_window

    def marked(*args):
        w = base(*args)
        w.noise = np.arange(w.n, dtype=float)[:, None]  # no change reads it
        return w

    monkeypatch.setattr(families_composed, "healthy_window", marked)
    _, _, hw = episodes.hardware("h200", 40, None)
    families_composed.healthy_composed(np.random.default_rng(3), hw, 40)
    per_episode = touched.sum(axis=1)
    assert ((per_episode >= 2) & (per_episode <= 4)).all(), per_episode
    assert (touched <= 1).all() and (touched.sum(axis=0) > 0).all()


def test_training_replays_the_captures_earlier_half_and_the_test_split_its_later_half(data):
    """Version 9 had seen no real signal in training and read 2.5 % of the real under-load windows
    as a communication fault; training now replays the capture's earlier half, and the test split
    keeps the later half, which training never sees."""
    capture = episodes.Capture.read()
    _, h200, _ = episodes.hardware("h200", 1, capture)
    for load, samples in ((True, capture.load), (False, capture.idle)):
        half = len(samples) // 2
        early, late = ({tuple(r) for r in part[:, :2]} for part in (samples[:half], samples[half:]))
        for is_early, allowed in ((True, early), (False, late)):
            w = families.replay(np.random.default_rng(1), h200, h200, capture, 20, load, is_early)
            drawn = set(zip(w.temp.ravel().tolist(), w.power.ravel().tolist(), strict=True))
            assert drawn <= allowed, (load, is_early)
    trained = set(data.family[data.split != "test"])
    assert set(episodes.REPLAYED_TRAINING) <= trained and not set(episodes.REPLAYED) & trained
