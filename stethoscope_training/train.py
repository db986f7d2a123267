"""`stethoscope model train`: fit the classifier on the episodes' train split, choose per-class
thresholds on validation, export both graphs to ONNX, check onnxruntime gives what torch gives, score
the shipped graphs on the test split and write the metadata (docs/design.md "Learned diagnosis").

torch (a dependency of aicluster-stethoscope-training) is imported only inside these functions;
inference needs none of it."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stethoscope.model.metadata import (
    CLASSES,
    DEFAULT_NAME,
    FEATURES,
    ModelError,
    ModelMeta,
    Normalisation,
    detector_weights,
)
from stethoscope.timeutil import iso, now_ms
from stethoscope_training import evaluate

PARITY = 1e-4  # max abs difference of probabilities between torch and onnxruntime
MIN_STD = 1e-3


class TorchMissing(ModelError):
    """Training without torch."""


@contextlib.contextmanager
def _builtin_intern() -> Iterator[None]:
    """ansible-core replaces sys.intern with a callable object (to accept str subclasses) once it is
    imported in the process; torch's compiler registers polyfills against sys.intern on first use and
    refuses anything but a function. Torch is set up with the builtin in place."""
    current = sys.intern
    builtin = getattr(type(current), "unpatched_implementation", None)
    if builtin is None:
        yield
        return
    sys.intern = builtin
    try:
        yield
    finally:
        sys.intern = current


def require_torch() -> Any:
    try:
        with _builtin_intern():
            import torch
            import torch._dynamo
    except ImportError:
        raise TorchMissing(
            "training needs torch, which is not installed: pip install aicluster-stethoscope-training"
        ) from None
    return torch


@dataclass
class TrainConfig:
    seed: int = 7
    hidden: int = 32
    head: int = 32
    epochs: int = 24
    batch: int = 64
    lr: float = 3e-3
    weight_decay: float = 1e-4
    augment: float = 0.5  # share of fault episodes made intermittent each epoch
    dropout: float = 0.1
    threads: int = 1
    precision: float = 0.95  # on validation, so that test precision clears 0.92


@dataclass
class TrainResult:
    meta: ModelMeta
    seconds: float
    parity: float
    classifier: Any = None  # the trained torch network (nets.Classifier), in eval mode


def deterministic(seed: int, threads: int) -> Any:
    torch = require_torch()
    torch.manual_seed(seed)
    np.random.seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads)
    return torch


def transformed(x: np.ndarray) -> np.ndarray:
    out = x.astype(np.float64)
    for f, feature in enumerate(FEATURES):
        if feature.transform == "log1p":
            out[..., f] = np.log1p(np.maximum(out[..., f], 0.0))
    return out


def _stats(x: np.ndarray, mask: np.ndarray) -> Normalisation:
    values = np.where(mask > 0, transformed(x), np.nan).reshape(-1, x.shape[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a feature the episodes never observed
        mean = np.nan_to_num(np.nanmean(values, axis=0), nan=0.0)
        std = np.nan_to_num(np.nanstd(values, axis=0), nan=1.0)
    return Normalisation([round(float(m), 6) for m in mean], [round(float(max(s, MIN_STD)), 6) for s in std])


def normalisation_of(x: np.ndarray, mask: np.ndarray, hw_class: np.ndarray) -> dict[str, Normalisation]:
    """Mean and std of each (transformed) feature over the observed steps: over all the episodes
    given ("default") and per hardware class."""
    norms = {"default": _stats(x, mask)}
    for hw in sorted(set(hw_class.tolist()) - {""}):
        chosen = hw_class == hw
        norms[str(hw)] = _stats(x[chosen], mask[chosen])
    return norms


def baselines(xn: np.ndarray, mask: np.ndarray, onset: np.ndarray) -> np.ndarray:
    """Per episode and feature: the median of the observed normalised steps before the onset (the
    whole window for a healthy episode)."""
    steps = np.arange(xn.shape[1])[None, :, None]
    before = (steps < np.where(onset < 1, xn.shape[1], onset)[:, None, None]) & (mask > 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a feature never observed before the onset
        median = np.nanmedian(np.where(before, xn, np.nan), axis=1)
    return np.nan_to_num(median, nan=0.0).astype(np.float32)


def intermittent(
    rng: np.random.Generator, xn: np.ndarray, mask: np.ndarray, base: np.ndarray, onset: np.ndarray
) -> np.ndarray:
    """Augmentation: the same fault, but coming and going after its onset (a periodic gate with a
    random period, duty and phase lets the fault through; between the bursts the episode falls back
    to its own pre-onset level). A fault seen only as a steady shift in training is then also known
    when it is intermittent (a flapping link, input stalls)."""
    n, steps = xn.shape[:2]
    period = rng.integers(4, 17, (n, 1))
    duty = np.maximum(1, (period * rng.uniform(0.15, 0.5, (n, 1))).astype(int))
    phase = rng.integers(0, 16, (n, 1))
    t = np.arange(steps)[None, :]
    gate = (((t + phase) % period) < duty) | (t < onset[:, None])
    out = np.where(gate[:, :, None], xn, base[:, None, :])
    return np.where(mask > 0, out, 0.0).astype(np.float32)


def _fit(
    torch: Any,
    net: Any,
    xn: np.ndarray,
    mask: np.ndarray,
    labels: np.ndarray,
    onset: np.ndarray,
    val: tuple[np.ndarray, np.ndarray, np.ndarray],
    config: TrainConfig,
) -> None:
    """Class-weighted cross-entropy with Adam, a share of the fault episodes made intermittent anew
    each epoch; keeps the epoch with the best validation macro-F1 (model selection on validation,
    never on test)."""
    counts = np.bincount(labels, minlength=len(CLASSES)).astype(np.float64)
    weights = torch.tensor(counts.sum() / np.maximum(counts, 1) / len(CLASSES), dtype=torch.float32)
    loss_of = torch.nn.CrossEntropyLoss(weight=weights)
    optimiser = torch.optim.Adam(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    generator = torch.Generator().manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    base = baselines(xn, mask, onset)
    tm, ty = torch.from_numpy(mask), torch.from_numpy(labels)
    vx, vm, vy = (torch.from_numpy(a) for a in val)
    best, best_state = -1.0, None
    for _ in range(config.epochs):
        augmented = (labels != 0) & (rng.random(len(labels)) < config.augment)
        epoch_x = xn.copy()
        epoch_x[augmented] = intermittent(
            rng, xn[augmented], mask[augmented], base[augmented], onset[augmented]
        )
        tx = torch.from_numpy(epoch_x)
        net.train()
        order = torch.randperm(len(ty), generator=generator)
        for i in range(0, len(order), config.batch):
            chosen = order[i : i + config.batch]
            optimiser.zero_grad()
            logits = net.logits_of(net.embed(tx[chosen], tm[chosen]))
            loss_of(logits, ty[chosen]).backward()
            optimiser.step()
        net.eval()
        with torch.no_grad():
            pred = net(vx, vm).argmax(dim=1).numpy()
        f1 = evaluate.class_scores(vy.numpy(), pred)["macro_f1"]
        if f1 > best:
            best, best_state = f1, {k: v.clone() for k, v in net.state_dict().items()}
    if best_state is not None:
        net.load_state_dict(best_state)


def export(
    torch: Any, net: Any, path: Path, inputs: tuple, input_names: list[str], output_names: list[str]
) -> None:
    axes = {name: {0: "N"} for name in (*input_names, *output_names)}
    with warnings.catch_warnings():
        # "batch_size other than 1 with GRU": the graph has no initial state input, so the GRU's
        # zero state follows the batch size (evaluation and a test run it at other batch sizes)
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the GRU's shape checks, constant here
        # the TorchScript exporter (dynamo=False) is deprecated but exports nn.GRU as one ONNX GRU
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            net,
            inputs,
            str(path),
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )


def parity(torch: Any, net: Any, path: Path, inputs: dict[str, np.ndarray], outputs: list[str]) -> float:
    """The largest difference between torch's and onnxruntime's outputs on the same inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(outputs, inputs)
    with torch.no_grad():
        want = net(*(torch.from_numpy(v) for v in inputs.values()))
    want = want if isinstance(want, tuple) else (want,)
    pairs = zip(got, want, strict=True)
    return max(float(np.max(np.abs(g - w.numpy()))) if g.size else 0.0 for g, w in pairs)


def _checked_export(
    torch: Any, net: Any, final: Path, inputs: dict[str, np.ndarray], outputs: list[str]
) -> float:
    tmp = final.with_suffix(".onnx.tmp")
    export(torch, net, tmp, tuple(torch.from_numpy(v) for v in inputs.values()), list(inputs), outputs)
    diff = parity(torch, net, tmp, inputs, outputs)
    if diff > PARITY:
        tmp.unlink()
        raise ModelError(f"{final.name}: onnxruntime differs from torch by {diff:.2e} (> {PARITY:.0e})")
    os.replace(tmp, final)
    return diff


def train(
    episodes: Any,
    out_dir: Path,
    name: str = DEFAULT_NAME,
    data_hash: str = "",
    config: TrainConfig | None = None,
) -> TrainResult:
    """Train, export, check and score; writes out_dir/<name>.onnx, <name>.outlier.onnx, <name>.json."""
    from stethoscope.model.features import normalise
    from stethoscope_training.nets import Classifier, Detector

    config = config or TrainConfig()
    started = time.perf_counter()
    torch = deterministic(config.seed, config.threads)
    split, x_all, mask_all = episodes.split, episodes.x, episodes.mask
    train_i, val_i = np.flatnonzero(split == "train"), np.flatnonzero(split == "validation")
    if not len(train_i) or not len(val_i):
        raise ModelError("the episodes have no train or no validation split")
    meta = ModelMeta(
        name=name,
        features=list(FEATURES),
        normalisation=normalisation_of(x_all[train_i], mask_all[train_i], episodes.hw_class[train_i]),
        thresholds={},
        data="synthetic",
        data_hash=data_hash,
        seed=config.seed,
        graphs={"classifier": f"{name}.onnx", "detector": f"{name}.outlier.onnx"},
    )
    xn = normalise(episodes.x, episodes.mask, meta, list(episodes.hw_class))
    mask = episodes.mask.astype(np.float32)
    net = Classifier(len(FEATURES), config.hidden, config.head, len(CLASSES), config.dropout)
    _fit(
        torch,
        net,
        xn[train_i],
        mask[train_i],
        episodes.label[train_i],
        episodes.onset[train_i],
        (xn[val_i], mask[val_i], episodes.label[val_i]),
        config,
    )
    net.eval()

    out_dir.mkdir(parents=True, exist_ok=True)
    probe = np.concatenate([val_i, np.flatnonzero(split == "test")])[:256]
    diff = _checked_export(
        torch, net, out_dir / meta.graphs["classifier"], {"x": xn[probe], "mask": mask[probe]}, ["probs"]
    )
    peer, peer_mask = evaluate.peer_windows(
        xn[probe], mask[probe], ["all"] * len(probe), episodes.label[probe] == 0, config.seed
    )
    diff = max(
        diff,
        _checked_export(
            torch,
            Detector(detector_weights(meta.features)),
            out_dir / meta.graphs["detector"],
            {"x": xn[probe], "mask": mask[probe], "peer": peer, "peer_mask": peer_mask},
            ["score", "deviation"],
        ),
    )

    meta.path = out_dir / f"{name}.json"
    graphs = evaluate.Graphs(meta)
    meta.thresholds = {c: 0.5 for c in CLASSES[1:]} | {"outlier": float("inf")}
    val_out = evaluate.run_graphs(graphs, episodes, val_i, config.seed)
    val_labels = episodes.label[val_i]
    meta.thresholds = evaluate.choose_thresholds(val_out.probs, val_labels, precision=config.precision)
    meta.thresholds["outlier"] = evaluate.choose_outlier_threshold(val_out.score, val_labels == 0)
    meta.scores = {s: score_split(graphs, episodes, s, config.seed) for s in ("validation", "test")}
    seconds = time.perf_counter() - started
    meta.history.append(history_entry("train", episodes, meta, seconds))
    meta.save(out_dir / f"{name}.json")
    return TrainResult(meta, seconds, diff, net)


def score_split(graphs: evaluate.Graphs, episodes: Any, split: str, seed: int) -> dict[str, Any]:
    index = np.flatnonzero(episodes.split == split)
    if not len(index):
        return {}
    out = evaluate.run_graphs(graphs, episodes, index, seed)
    timed = evaluate.reports_timings(episodes.mask[index])
    return evaluate.score_outputs(out, episodes.label[index], episodes.family[index], timed)


def history_entry(
    action: str, episodes: Any, meta: ModelMeta, seconds: float, **extra: Any
) -> dict[str, Any]:
    test = meta.scores.get("test", {})
    return {
        "action": action,
        "at": iso(now_ms()),
        "seed": meta.seed,
        "data_hash": meta.data_hash,
        "episodes": len(episodes.label),
        "hw_classes": sorted(set(episodes.hw_class.tolist())),
        "test_macro_f1": test.get("macro_f1"),
        "seconds": round(seconds, 1),
        **extra,
    }
