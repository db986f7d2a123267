"""Small graphs that keep the shipped model's ONNX contract (docs/design.md "Learned diagnosis"),
exported by torch into a test's folder with their metadata: for the inference,
explanation and findings tests to run through onnxruntime before (or besides) the trained model.

- classifier: per class, a logit from the window's mean of chosen normalised features; the
  communication probability rises with rdma_qps_dropped_per_second (6) and train_allreduce_latency_ms (10).
- detector: deviation[f] = |mean over steps of (x - peer)| where both are observed; score = its sum.
"""

from __future__ import annotations

from pathlib import Path

import torch

from stethoscope.model.metadata import CLASSES, FEATURES, ModelMeta, Normalisation

# class -> features whose mean raises its logit (index into FEATURES)
DRIVERS = {"communication": (6, 10), "storage": (8, 11), "compute": (0, 2)}
BIAS = 3.0  # a healthy window (all features at their mean) is healthy by a wide margin
SLOPE = 2.0

# means/stds in the metric's own units (log1p space for log1p features), near an idle H200 node
MEAN = [40.0, 600.0, 1980.0, 5.0, 0.0, 0.0, 0.0, 0.0, 35.0, 6.0, 4.0, 1.0]
STD = [5.0, 100.0, 50.0, 5.0, 0.5, 0.5, 0.5, 0.5, 3.0, 0.5, 0.5, 0.5]


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        weight = torch.zeros(len(CLASSES), len(FEATURES))
        bias = torch.zeros(len(CLASSES))
        for index, name in enumerate(CLASSES[1:], start=1):
            for feature in DRIVERS[name]:
                weight[index, feature] = SLOPE if feature != 2 else -SLOPE  # a low clock is compute
            bias[index] = -BIAS
        self.weight = torch.nn.Parameter(weight)
        self.bias = torch.nn.Parameter(bias)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seen = mask.sum(dim=1).clamp(min=1.0)
        mean = (x * mask).sum(dim=1) / seen  # [N, 12]
        return torch.softmax(mean @ self.weight.T + self.bias, dim=-1)


class Detector(torch.nn.Module):
    def forward(self, x, mask, peer, peer_mask):  # type: ignore[no-untyped-def]
        both = mask * peer_mask
        seen = both.sum(dim=1).clamp(min=1.0)
        deviation = (((x - peer) * both).sum(dim=1) / seen).abs()
        return deviation.sum(dim=-1), deviation


def _export(module: torch.nn.Module, inputs: tuple, names: list[str], outputs: list[str], path: Path) -> None:
    dynamic = {name: {0: "n"} for name in (*names, *outputs)}
    torch.onnx.export(
        module,
        inputs,
        str(path),
        input_names=names,
        output_names=outputs,
        dynamic_axes=dynamic,
        opset_version=17,
        dynamo=False,
    )


def write_model(
    directory: Path,
    name: str = "core12",
    thresholds: dict[str, float] | None = None,
    normalisation: Normalisation | None = None,
) -> Path:
    """The two graphs and their metadata in `directory`; -> the metadata's path."""
    directory.mkdir(parents=True, exist_ok=True)
    x = torch.zeros(2, 120, len(FEATURES))
    mask = torch.ones(2, 120, len(FEATURES))
    _export(Classifier().eval(), (x, mask), ["x", "mask"], ["probs"], directory / f"{name}.onnx")
    _export(
        Detector().eval(),
        (x, mask, x, mask),
        ["x", "mask", "peer", "peer_mask"],
        ["score", "deviation"],
        directory / f"{name}.outlier.onnx",
    )
    meta = ModelMeta(
        name=name,
        features=list(FEATURES),
        normalisation={"default": normalisation or Normalisation(list(MEAN), list(STD))},
        thresholds=thresholds or {"communication": 0.5, "storage": 0.5, "compute": 0.5, "outlier": 3.0},
        data="synthetic",
        data_hash="test",
        graphs={"classifier": f"{name}.onnx", "detector": f"{name}.outlier.onnx"},
    )
    path = directory / f"{name}.json"
    meta.save(path)
    return path
