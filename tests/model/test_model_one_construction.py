"""The training side's figures come from the runtime's own ONNX loader, with its contract check,
so training and the runtime judge a model alike."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from stethoscope.model import inference, metadata

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    sys.path.insert(0, str(TESTS))
    from model_graphs import write_model

    return write_model(tmp_path_factory.mktemp("model"))


def test_evaluation_refuses_a_graph_that_breaks_the_runtimes_contract(
    model_path: Path, tmp_path: Path
) -> None:
    """Regression: evaluate.py loaded the graphs without the check inference.py makes, so a detector
    file holding another graph was scored where the runtime refuses it."""
    from stethoscope_training import evaluate

    (tmp_path / "core12.json").write_bytes((model_path.parent / "core12.json").read_bytes())
    for name in ("core12.onnx", "core12.outlier.onnx"):  # the classifier where the detector belongs
        (tmp_path / name).write_bytes((model_path.parent / "core12.onnx").read_bytes())
    with pytest.raises(metadata.ModelError, match=r"the detector takes"):
        evaluate.Graphs(metadata.load(tmp_path / "core12.json"))
    assert evaluate.Graphs is inference.Graphs
