"""Training the learned diagnosis (stethoscope_training.train): export parity between torch and
onnxruntime, reproducibility for a seed, and that a graph which disagrees with torch is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

pytest.importorskip("torch", reason="training needs torch (aicluster-stethoscope-training)")

from stethoscope.model.features import normalise
from stethoscope.model.metadata import ERROR_COUNTERS, ModelError, load
from stethoscope_training import episodes, evaluate
from stethoscope_training.train import TrainConfig, parity, train

from conftest import TOP

SMALL = TrainConfig(seed=7, hidden=8, head=8, epochs=3)


@pytest.fixture(scope="module")
def data() -> episodes.Episodes:
    return episodes.generate(seed=7, per_family=12)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("model")
    return train(data, out, "small", data.data_hash(), SMALL), out


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_onnxruntime_gives_the_trained_networks_probabilities(data, trained):
    import torch

    result, out = trained
    meta = load(out / "small.json")
    index = np.flatnonzero(data.split == "test")
    xn = normalise(data.x[index], data.mask[index], meta, list(data.hw_class[index]))
    got = _session(out / "small.onnx").run(["probs"], {"x": xn, "mask": data.mask[index]})[0]
    with torch.no_grad():
        want = result.classifier(torch.from_numpy(xn), torch.from_numpy(data.mask[index])).numpy()
    assert got.shape == (len(index), 4)
    assert np.max(np.abs(got - want)) <= 1e-4
    assert np.allclose(got.sum(axis=1), 1.0, atol=1e-5)


def test_detector_scores_a_node_against_its_peers_median(data, trained):
    _, out = trained
    meta = load(out / "small.json")
    index = np.flatnonzero(data.split == "validation")
    xn = normalise(data.x[index], data.mask[index], meta, list(data.hw_class[index]))
    mask = data.mask[index]
    session = _session(out / "small.outlier.onnx")
    same = session.run(["score", "deviation"], {"x": xn, "mask": mask, "peer": xn, "peer_mask": mask})
    assert np.allclose(same[0], 0.0) and np.allclose(same[1], 0.0)  # a node equal to its peers
    far = xn.copy()
    far[:, :, 7] += 5.0 * mask[:, :, 7]  # IB xmit wait 5 std above the peers'
    score, deviation = session.run(
        ["score", "deviation"], {"x": far, "mask": mask, "peer": xn, "peer_mask": mask}
    )
    assert (deviation.argmax(axis=1) == 7).all()
    assert np.allclose(score, deviation.sum(axis=1), atol=1e-4) and (deviation >= 0).all()
    # the error counters are left to the rules and the classifier: a trickle its peers lack is no outlier
    counters = [i for i, f in enumerate(meta.features) if f.metric in ERROR_COUNTERS]
    assert counters == [4, 5, 6]
    noisy = xn.copy()
    noisy[:, :, counters] += 5.0 * mask[:, :, counters]
    score, deviation = session.run(
        ["score", "deviation"], {"x": noisy, "mask": mask, "peer": xn, "peer_mask": mask}
    )
    assert np.allclose(score, 0.0) and np.allclose(deviation, 0.0)


def test_a_graph_that_differs_from_torch_is_caught_by_the_parity_check(data, trained):
    import torch

    result, out = trained
    index = np.flatnonzero(data.split == "test")[:32]
    inputs = {"x": np.nan_to_num(data.x[index] / 1000.0), "mask": data.mask[index]}
    assert parity(torch, result.classifier, out / "small.onnx", inputs, ["probs"]) <= 1e-4
    with torch.no_grad():
        result.classifier.head2.bias[0] += 0.5  # one class: a shift of all cancels in softmax
    try:
        assert parity(torch, result.classifier, out / "small.onnx", inputs, ["probs"]) > 1e-4
    finally:
        with torch.no_grad():
            result.classifier.head2.bias[0] -= 0.5


def test_same_seed_gives_the_same_scores(data, tmp_path):
    first = train(data, tmp_path / "a", "small", "h", SMALL).meta
    second = train(data, tmp_path / "b", "small", "h", SMALL).meta
    for split in ("validation", "test"):
        assert abs(first.scores[split]["macro_f1"] - second.scores[split]["macro_f1"]) <= 0.01
        for cls, scores in first.scores[split]["per_class"].items():
            assert abs(scores["f1"] - second.scores[split]["per_class"][cls]["f1"]) <= 0.01
    for name, value in first.thresholds.items():
        assert abs(value - second.thresholds[name]) <= 0.01


def test_metadata_records_data_seed_thresholds_scores_and_history(data, trained):
    _, out = trained
    meta = load(out / "small.json")
    assert meta.data == "synthetic" and meta.data_hash == data.data_hash() and meta.seed == 7
    assert set(meta.thresholds) == {"communication", "storage", "compute", "outlier"}
    assert {"default", "NVIDIA H200"} <= set(meta.normalisation)
    assert meta.scores["test"]["episodes"] == int(np.sum(data.split == "test"))
    assert meta.history[-1]["action"] == "train" and meta.history[-1]["data_hash"] == data.data_hash()


def test_episodes_without_a_validation_split_are_refused(data, tmp_path):
    from dataclasses import replace

    only_train = replace(data, split=np.where(data.split == "validation", "train", data.split))
    with pytest.raises(ModelError, match="no train or no validation"):
        train(only_train, tmp_path, "small", "h", SMALL)


def test_thresholds_are_chosen_on_validation_for_the_precision_asked():
    labels = np.array([0] * 50 + [1] * 50)
    probs = np.zeros((100, 4), np.float32)
    probs[:, 0] = np.linspace(0.9, 0.0, 100)
    probs[:, 1] = 1 - probs[:, 0]
    chosen = evaluate.choose_thresholds(probs, labels, precision=0.95)
    said = evaluate.decide(probs, chosen | {"outlier": 1.0})
    tp = np.sum((said == 1) & (labels == 1))
    assert tp / max(1, np.sum(said == 1)) >= 0.95


def test_training_sets_torch_up_in_a_process_that_imported_ansible_first() -> None:
    # ansible-core swaps sys.intern for a callable object; torch's compiler then refused to start
    # ("substitute_in_graph expects a function"), failing every training test after an ansible one
    script = (
        "import sys, ansible.playbook\n"
        "assert type(sys.intern).__name__ == 'SysInternPatch'\n"
        "from stethoscope_training.train import require_torch\n"
        "torch = require_torch()\n"
        "torch.manual_seed(1); torch.use_deterministic_algorithms(True)\n"
        "print(type(sys.intern).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=TOP, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "SysInternPatch"  # ansible's patch is back in place afterwards
