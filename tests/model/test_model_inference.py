"""The graphs through onnxruntime (docs/design.md "Learned diagnosis"): one batch for the fleet, peers
of the same class and job, and no torch needed to run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stethoscope.model import metadata
from stethoscope.model.explain import explain_classes, shares
from stethoscope.model.inference import Graphs, graphs_for, peer_groups

TESTS = Path(__file__).resolve().parents[1]
STEPS, WIDTH = 120, len(metadata.FEATURES)
NAMES = [f.metric for f in metadata.FEATURES]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from model_graphs import write_model

    return write_model(tmp_path_factory.mktemp("model"))


@pytest.fixture(scope="module")
def graphs(model_path: Path) -> Graphs:
    return graphs_for(metadata.load(model_path))


def windows(count: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return (
        rng.normal(0, 0.1, (count, STEPS, WIDTH)).astype(np.float32),
        np.ones((count, STEPS, WIDTH), np.float32),
    )


def test_communication_probability_rises_with_rdma_drops(graphs: Graphs) -> None:
    x, mask = windows(2)
    x[1, 60:, 6] = 4.0
    probs = graphs.classify(x, mask)
    assert probs.shape == (2, 4)
    assert np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert probs[1, 1] > 0.5 > probs[0, 1]


def test_the_node_that_leaves_its_peers_scores_highest_on_the_feature_that_moved(graphs: Graphs) -> None:
    x, mask = windows(6)
    x[2, :, 7] += 3.0  # xmit wait on one node of the job
    result = graphs.outlier(x, mask, ["h200"] * 6, ["job1"] * 6)
    assert result.scored.all()
    assert int(np.argmax(result.score)) == 2
    assert int(np.argmax(result.deviation[2])) == 7
    assert result.score[2] > 5 * np.delete(result.score, 2).max()


def test_a_peer_group_under_three_nodes_gets_no_outlier_score(graphs: Graphs) -> None:
    x, mask = windows(5)
    result = graphs.outlier(x, mask, ["h200"] * 5, ["job1", "job1", "job1", "job2", "job2"])
    assert result.scored.tolist() == [True, True, True, False, False]
    assert np.isnan(result.score[3:]).all() and not np.isnan(result.score[:3]).any()


def test_peers_are_the_same_hardware_class_and_job() -> None:
    groups = peer_groups(["h200", "h200", "a100", "h200", "h200", ""], ["j", "j", "j", "j", "", "j"])
    assert groups == [[0, 1, 3]]  # no job and unknown class: not peers of j's H200s


def test_a_node_unlike_a_large_group_stands_out_through_the_group_median(graphs: Graphs) -> None:
    x, mask = windows(40)
    x[7, :, 8] += 2.5
    result = graphs.outlier(x, mask, ["h200"] * 40, [""] * 40)
    assert int(np.argmax(result.score)) == 7


def test_gaps_stay_out_of_the_peer_median(graphs: Graphs) -> None:
    x, mask = windows(4)
    mask[0, :, 5] = 0.0  # node 0 never reports symbol errors; its zeros must not pull the median
    x[0, :, 5] = 0.0
    x[1:, :, 5] += 1.0
    result = graphs.outlier(x, mask, ["h200"] * 4, ["j"] * 4)
    assert result.deviation[1:, 5].max() < 0.3


def test_occlusion_explanation_puts_the_features_that_moved_first_and_sums_to_100(graphs: Graphs) -> None:
    x, mask = windows(3)
    x[1, :, 6] = 2.0
    x[1, :, 10] = 1.5
    x[1, :, 0] = 0.4  # a little warmer: not part of the communication logit
    probs = graphs.classify(x, mask)
    (explanation,) = explain_classes(graphs, x, mask, [(1, 1)], probs, NAMES)
    assert abs(sum(explanation.values()) - 100.0) < 1e-9
    assert min(explanation.values()) > 0
    assert list(explanation)[:2] == ["rdma_qps_dropped_per_second", "train_allreduce_latency_ms"]
    assert explanation["rdma_qps_dropped_per_second"] + explanation["train_allreduce_latency_ms"] >= 95


def test_shares_sum_to_exactly_100_with_negative_drops_counted_as_zero() -> None:
    got = shares(np.array([1.0, 1.0, 1.0, -5.0]), ["a", "b", "c", "d"])
    assert got == {"a": 33.4, "b": 33.3, "c": 33.3}
    assert sum(got.values()) == pytest.approx(100.0)


def test_shares_fall_back_to_the_distance_from_healthy_when_no_occlusion_lowers_it() -> None:
    got = shares(np.array([-1.0, 0.0]), ["a", "b"], fallback=np.array([3.0, 1.0]))
    assert got == {"a": 75.0, "b": 25.0}


def test_a_damaged_graph_is_a_model_error_naming_the_file(model_path: Path, tmp_path: Path) -> None:
    for name in ("core12.json", "core12.outlier.onnx"):
        (tmp_path / name).write_bytes((model_path.parent / name).read_bytes())
    (tmp_path / "core12.onnx").write_bytes(b"not a graph")
    with pytest.raises(metadata.ModelError, match=r"core12\.onnx: onnxruntime cannot load the classifier"):
        Graphs(metadata.load(tmp_path / "core12.json"))


def test_inference_runs_with_torch_absent(model_path: Path) -> None:
    code = f"""
import sys
sys.modules["torch"] = None  # any import of torch now fails
import numpy as np
from stethoscope.model import metadata, inference, explain, findings, path
graphs = inference.graphs_for(metadata.load(__import__("pathlib").Path({str(model_path)!r})))
x = np.zeros((4, 120, 12), np.float32); mask = np.ones_like(x); x[0, :, 6] = 3
probs = graphs.classify(x, mask)
out = graphs.outlier(x, mask, ["h200"] * 4, [""] * 4)
torch_loaded = sys.modules.get("torch") is not None
print(round(float(probs[0, 1]), 2), int(np.argmax(out.score)), torch_loaded)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    probability, worst, torch_loaded = run.stdout.split()
    assert float(probability) > 0.5 and worst == "0" and torch_loaded == "False"


def test_the_peer_median_equals_numpys_nanmedian_over_the_observed_values() -> None:
    from stethoscope.model.robust import nanmedian

    rng = np.random.default_rng(11)
    for size in (1, 2, 3, 8):
        values = rng.normal(size=(size, 20, WIDTH)).astype(np.float32)
        values[rng.random(values.shape) < 0.4] = np.nan
        median = nanmedian(values, axis=0)
        seen = ~np.isnan(values).all(axis=0)
        expected = np.nanmedian(np.where(seen[None], values, 0.0), axis=0)
        assert median.dtype == np.float32  # a fleet's peer medians: no float64 copy of its windows
        assert np.array_equal(~np.isnan(median), seen)
        assert np.allclose(median[seen], expected[seen], atol=1e-6)


def test_the_model_computes_its_medians_with_one_function() -> None:
    """Regression: robust.nanmedian copied inference._median, and jobs.py and switches.py wrapped it
    in a _median of their own that added nothing: one definition."""
    import ast

    package = Path(__file__).resolve().parents[2] / "stethoscope/model"
    defined = sorted(
        f"{path.name}:{node.name}"
        for path in package.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef) and "median" in node.name
    )
    assert defined == ["robust.py:nanmedian"]
