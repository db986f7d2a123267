"""`stethoscope model finetune --class FP --episodes DIR`: adapt a shipped model to a new hardware
class from its first fault episodes (docs/design.md "Learned diagnosis").

The recurrent part stays frozen by construction: it is never rebuilt in torch. onnxruntime computes
the GRU's embedding (the input of `head1`) from the shipped graph, torch trains only `head1` and
`head2` on it, and their new weights are written back into the same graph. The new class gets its own
normalisation; the old classes' episodes are rehearsed beside the new ones so that they keep their
scores."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stethoscope.model.metadata import CLASSES, ModelError, ModelMeta, Normalisation
from stethoscope.paths import own_models_dir
from stethoscope_training import evaluate
from stethoscope_training.train import (
    MIN_STD,
    PARITY,
    TrainConfig,
    deterministic,
    history_entry,
    normalisation_of,
)

HEADS = ("head1.weight", "head1.bias", "head2.weight", "head2.bias")
# old-class training episodes trained beside the new class's, this many of each family: a fixed 600
# in all thinned to 6 a family once the generator had a hundred, and the old classes fell 2.4 points
# after fine-tuning (with 12 a family: 1.3; both measured on the old classes' test split)
REHEARSAL_PER_FAMILY = 12


@dataclass
class FinetuneResult:
    meta: ModelMeta
    before: dict[str, Any]  # the new class, shipped model
    after: dict[str, Any]
    old_before: dict[str, Any]  # the old classes' test split
    old_after: dict[str, Any]
    seconds: float
    faults: int


def _classifier(meta: ModelMeta) -> Any:
    import onnx

    return onnx.load(str(meta.graph_path("classifier")))


def _embedding_name(model: Any) -> str:
    for node in model.graph.node:
        if "head1.weight" in node.input:
            return str(node.input[0])
    raise ModelError("classifier graph has no head1 (not trained by `stethoscope model train`)")


def embeddings(meta: ModelMeta, xn: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The frozen GRU's output (head1's input), computed by onnxruntime from the shipped graph."""
    import onnx
    import onnxruntime as ort

    model = _classifier(meta)
    name = _embedding_name(model)
    model.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    parts = [
        session.run([name], {"x": xn[i : i + 1024], "mask": mask[i : i + 1024]})[0]
        for i in range(0, len(xn), 1024)
    ]
    return np.concatenate(parts)


def first_faults(episodes: Any, index: np.ndarray, count: int) -> np.ndarray:
    """The first `count` fault episodes, taken in turn from each fault class."""
    per_class = [list(index[episodes.label[index] == c]) for c in range(1, len(CLASSES))]
    chosen: list[int] = []
    while len(chosen) < count and any(per_class):
        for members in per_class:
            if members and len(chosen) < count:
                chosen.append(members.pop(0))
    return np.asarray(sorted(chosen), dtype=int)


def _scores(meta: ModelMeta, episodes: Any, index: np.ndarray) -> dict[str, Any]:
    out = evaluate.run_graphs(evaluate.Graphs(meta), episodes, index, meta.seed)
    return evaluate.score_outputs(out, episodes.label[index], episodes.family[index])


def matched_normalisation(
    default: Normalisation, new_healthy: Normalisation, old_healthy: Normalisation
) -> Normalisation:
    """The new class's statistics chosen so that its healthy episodes normalise to what the old
    classes' healthy episodes normalise to (mean and spread matched per feature): the shift of a new
    hardware generation is taken out before the heads see it."""
    mean, std = [], []
    for f in range(len(default.mean)):
        scale = new_healthy.std[f] / old_healthy.std[f]
        if min(new_healthy.std[f], old_healthy.std[f]) <= 2 * MIN_STD:
            scale = 1.0  # a feature without healthy spread (an error rate at 0): shift only
        mean.append(round(new_healthy.mean[f] - scale * (old_healthy.mean[f] - default.mean[f]), 6))
        std.append(round(max(MIN_STD, scale * default.std[f]), 6))
    return Normalisation(mean, std)


def train_heads(
    meta: ModelMeta, emb: np.ndarray, labels: np.ndarray, weights: np.ndarray, config: TrainConfig
) -> dict[str, np.ndarray]:
    import onnx.numpy_helper as nh

    torch = deterministic(config.seed, config.threads)
    initial = {i.name: nh.to_array(i).copy() for i in _classifier(meta).graph.initializer if i.name in HEADS}
    head1 = torch.nn.Linear(*initial["head1.weight"].shape[::-1])
    head2 = torch.nn.Linear(*initial["head2.weight"].shape[::-1])
    with torch.no_grad():
        for layer, name in ((head1, "head1"), (head2, "head2")):
            layer.weight.copy_(torch.from_numpy(initial[f"{name}.weight"]))
            layer.bias.copy_(torch.from_numpy(initial[f"{name}.bias"]))
    net = torch.nn.Sequential(head1, torch.nn.ReLU(), head2)
    optimiser = torch.optim.Adam(net.parameters(), lr=config.lr)
    e, y, w = torch.from_numpy(emb), torch.from_numpy(labels), torch.from_numpy(weights.astype(np.float32))
    for _ in range(config.epochs):
        optimiser.zero_grad()
        loss = (torch.nn.functional.cross_entropy(net(e), y, reduction="none") * w).sum() / w.sum()
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        want = torch.softmax(net(e[:256]), dim=1).numpy()
    trained = {
        f"{n}.{p}": getattr(layer, p).detach().numpy().copy()
        for layer, n in ((head1, "head1"), (head2, "head2"))
        for p in ("weight", "bias")
    }
    trained["_probe"] = want
    return trained


def write_classifier(
    meta: ModelMeta,
    heads: dict[str, np.ndarray],
    target: Path,
    probe: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """Write the new head weights into the graph and check onnxruntime gives what torch gave."""
    import onnx
    import onnx.numpy_helper as nh
    import onnxruntime as ort

    model = _classifier(meta)
    for init in model.graph.initializer:
        if init.name in HEADS:
            init.CopyFrom(nh.from_array(heads[init.name].astype(np.float32), init.name))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xn, mask, want = probe
    got = session.run(["probs"], {"x": xn, "mask": mask})[0]
    diff = float(np.max(np.abs(got - want))) if len(got) else 0.0
    if diff > PARITY:
        raise ModelError(f"{target.name}: fine-tuned graph differs from torch by {diff:.2e}")
    tmp = target.with_suffix(".onnx.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(target)


def rehearsal(old: Any, rng: np.random.Generator) -> np.ndarray:
    """REHEARSAL_PER_FAMILY training episodes of each old family (all of a smaller one)."""
    train = np.flatnonzero(old.split == "train")
    families = old.family[train]
    return np.concatenate(
        [
            rng.choice(
                train[families == family],
                size=min(REHEARSAL_PER_FAMILY, int(np.sum(families == family))),
                replace=False,
            )
            for family in np.unique(families)
        ]
    )


def finetune(
    meta: ModelMeta,
    hw_class: str,
    new: Any,
    old: Any,
    out_dir: Path | None = None,
    faults: int = 10,
    config: TrainConfig | None = None,
) -> FinetuneResult:
    """Fine-tune `meta`'s heads on `new`'s first `faults` fault episodes of `hw_class` (train split)
    and its healthy train episodes, rehearsing `old`'s train split; score the new class on its other
    splits and the old classes on their test split, before and after. Writes the model into out_dir,
    by default the state folder's models/ (never the package's)."""
    from stethoscope.model.features import normalise

    config = config or TrainConfig(epochs=300, lr=3e-3, seed=meta.seed)
    started = time.perf_counter()
    mine = new.hw_class == hw_class
    train_i = np.flatnonzero(mine & (new.split == "train"))
    tuned_faults = first_faults(new, train_i[new.label[train_i] != 0], faults)
    if len(tuned_faults) < faults:
        raise ModelError(
            f"fine-tuning {hw_class} needs {faults} fault episodes of it in the train split; "
            f"the episodes have {len(tuned_faults)}"
        )
    healthy_i = train_i[new.label[train_i] == 0]
    tuned = np.concatenate([tuned_faults, healthy_i])
    held_new = np.flatnonzero(mine & (new.split != "train"))
    old_test = np.flatnonzero(old.split == "test")
    before = _scores(meta, new, held_new)
    old_before = _scores(meta, old, old_test)

    old_healthy = np.flatnonzero((old.split == "train") & (old.label == 0))
    meta.normalisation[hw_class] = matched_normalisation(
        meta.norm_for(""),
        normalisation_of(new.x[healthy_i], new.mask[healthy_i], new.hw_class[healthy_i])["default"],
        normalisation_of(old.x[old_healthy], old.mask[old_healthy], old.hw_class[old_healthy])["default"],
    )
    rng = np.random.default_rng(config.seed)
    rehearsed = rehearsal(old, rng)
    xn_new = normalise(new.x[tuned], new.mask[tuned], meta, list(new.hw_class[tuned]))
    xn_old = normalise(old.x[rehearsed], old.mask[rehearsed], meta, list(old.hw_class[rehearsed]))
    xn = np.concatenate([xn_new, xn_old])
    mask = np.concatenate([new.mask[tuned], old.mask[rehearsed]]).astype(np.float32)
    labels = np.concatenate([new.label[tuned], old.label[rehearsed]])
    # the new class's few episodes weigh as much as all the rehearsed ones
    weights = np.concatenate([np.full(len(tuned), len(rehearsed) / len(tuned)), np.ones(len(rehearsed))])
    heads = train_heads(meta, embeddings(meta, xn, mask), labels, weights, config)

    target_dir = out_dir or own_models_dir()
    target_dir.mkdir(parents=True, exist_ok=True)
    if target_dir != meta.graph_path("classifier").parent:
        shutil.copy2(meta.graph_path("detector"), target_dir / meta.graphs["detector"])
    write_classifier(
        meta, heads, target_dir / meta.graphs["classifier"], (xn[:256], mask[:256], heads["_probe"])
    )
    meta.path = target_dir / f"{meta.name}.json"
    after = _scores(meta, new, held_new)
    old_after = _scores(meta, old, old_test)
    seconds = time.perf_counter() - started
    meta.scores["test"] = old_after  # the old classes' held-out test, after tuning
    meta.scores[f"finetune.{hw_class}"] = after  # the new class's episodes not tuned on
    meta.history.append(
        history_entry(
            "finetune",
            new,
            meta,
            seconds,
            hw_class=hw_class,
            fault_episodes=len(tuned_faults),
            healthy_episodes=len(healthy_i),
            new_before=_summary(before),
            new_after=_summary(after),
            old_before=_summary(old_before),
            old_after=_summary(old_after),
        )
    )
    meta.save(meta.path)
    return FinetuneResult(meta, before, after, old_before, old_after, seconds, len(tuned_faults))


def _summary(scores: dict[str, Any]) -> dict[str, Any]:
    return {key: scores[key] for key in ("accuracy", "macro_f1", "episodes")}


def render(result: FinetuneResult, hw_class: str) -> str:
    def line(label: str, s: dict[str, Any]) -> str:
        scores = f"accuracy {s['accuracy']:.3f}  macro-F1 {s['macro_f1']:.3f}"
        return f"  {label:<28} {scores}  ({s['episodes']} episodes)"

    return "\n".join(
        [
            f"fine-tuned head1+head2 for {hw_class} on {result.faults} fault episodes "
            f"in {result.seconds:.1f} s",
            line(f"{hw_class} before", result.before),
            line(f"{hw_class} after", result.after),
            line("old classes before", result.old_before),
            line("old classes after", result.old_after),
            f"wrote {result.meta.path}",
        ]
    )
