"""Real data in: `stethoscope model finetune --from-faults`.

1. Self-calibration. A GPU class the model has no normalisation for (an H100, A100 or T4 fleet, the
   model trained on the H200's) is not classified: its healthy windows would read as faults. Its
   normalisation is learned from its own healthy windows in the store: the stream's windows of its
   nodes at instants every STRIDE_MS back from the newest sample (over `days`), leaving out any
   node with a recorded fault within FAULT_MARGIN_MS of the instant and any node a finding names
   during the window (the `findings` table: a rule's, UNKNOWN's or the model's, info aside; its
   span first_seen..last_seen, open-ended while not resolved), and matched, as fine-tuning
   matches a new class (finetune.matched_normalisation), to what the model's own healthy episodes
   normalise to. The class is then classified, its findings marked "self-calibrated".
2. Fine-tuning on confirmed faults. The windows of the faults recorded in the store (`fault
   confirm`, and `fault add` / an imported file: each a person's statement of a real fault) come from
   `fault_windows` (replayed into a scratch database, as the audit does), at impact and at
   FAULT_OFFSETS_MS before it; each is labelled with its layer's class. With MIN_FAULTS faults or
   more, `head1` and `head2` are trained on them, the store's healthy windows and a rehearsal of the
   model's own episodes (finetune.py: the GRU stays as shipped).
numpy and onnxruntime for the calibration; torch for the heads."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stethoscope.diagnosis.layers import CLASS_LAYERS
from stethoscope.model.features import Windows, hw_classes, read_windows
from stethoscope.model.metadata import CLASSES, STEP_SECONDS, STEPS, ModelError, ModelMeta
from stethoscope.paths import own_models_dir
from stethoscope.store.client import Store
from stethoscope.store.faults import Fault, list_faults, replay_window
from stethoscope.store.schema import single_node_ddl
from stethoscope.timeutil import iso, now_ms

STRIDE_MS = 10 * 60 * 1000  # one window every 10 minutes: the windows do not overlap
WINDOW_MS = STEPS * STEP_SECONDS * 1000
FAULT_MARGIN_MS = 6 * 3600 * 1000
MIN_WINDOWS = 20  # healthy windows a class needs to be calibrated
FAULT_OFFSETS_MS = (0, 5 * 60 * 1000, 10 * 60 * 1000)
MIN_FAULTS = 10
REHEARSAL_EPISODES_PER_FAMILY = 20  # generated for the rehearsal (finetune.REHEARSAL_PER_FAMILY drawn)
SCRATCH_TTL_DAYS = 3650


@dataclass
class Calibrated:
    hw_class: str
    windows: int
    nodes: int


@dataclass
class FromStore:
    calibrated: list[Calibrated] = field(default_factory=list)
    too_few: dict[str, int] = field(default_factory=dict)  # class -> healthy windows found
    faults: int = 0  # faults whose windows were read
    fault_windows: int = 0
    unreadable: list[str] = field(default_factory=list)  # faults without windows left
    tuned: bool = False
    before: dict[str, Any] = field(default_factory=dict)  # accuracy on the fault windows
    after: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    seconds: float = 0.0
    needed: int = MIN_FAULTS


def _newest_stream_ms(store: Store) -> int | None:
    rows = store.query(
        f"SELECT count(), toUnixTimestamp64Milli(max(timestamp)) FROM {store.database}.metrics "
        "WHERE device = 'node' AND labels['source'] = 'stream'"
    )
    return int(rows[0][1]) if rows and rows[0][0] else None


def _near_faults(faults: list[Fault], at_ms: int) -> set[str]:
    return {f.node_id for f in faults if abs(f.impact_ms - at_ms) <= FAULT_MARGIN_MS}


@dataclass
class Unwell:
    """A finding that says its nodes are not healthy, over its span."""

    nodes: tuple[str, ...]  # its node, and those it names (a switch's, unknown.fleet's)
    first_ms: int
    last_ms: int  # open-ended (the largest int) while it is not resolved


def unwell(store: Store) -> list[Unwell]:
    """Every finding but an info one (a rule's, UNKNOWN's, the model's), its latest version."""
    rows = store.query(
        "SELECT argMax(node_id, version), "
        "JSONExtract(argMax(evidence, version), 'nodes', 'Array(String)'), "
        "toUnixTimestamp64Milli(argMax(first_seen, version)), "
        "toUnixTimestamp64Milli(argMax(last_seen, version)), "
        "argMax(status, version), argMax(severity, version) "
        f"FROM {store.database}.findings GROUP BY finding_id"
    )
    return [
        Unwell((node, *named), int(first), int(last) if status == "resolved" else np.iinfo(np.int64).max)
        for node, named, first, last, status, severity in rows
        if severity != "info"
    ]


def _unwell_during(found: list[Unwell], at_ms: int) -> set[str]:
    """The nodes a finding names during the window that ends at at_ms."""
    return {n for f in found if f.first_ms <= at_ms and f.last_ms >= at_ms - WINDOW_MS for n in f.nodes}


def healthy_windows(
    store: Store, days: float, faults: list[Fault], meta: ModelMeta
) -> dict[str, tuple[np.ndarray, np.ndarray, set[str]]]:
    """Per GPU class: (x, mask, nodes) of its streaming nodes' windows away from recorded faults and
    without a finding naming them."""
    newest = _newest_stream_ms(store)
    if newest is None:
        return {}
    findings = unwell(store)
    found: dict[str, tuple[list[np.ndarray], list[np.ndarray], set[str]]] = {}
    span = int(days * 24 * 3600 * 1000)
    for at in range(newest, newest - span, -STRIDE_MS):
        windows = read_windows(store, at, features=tuple(meta.features))
        near = _near_faults(faults, at) | _unwell_during(findings, at)
        for i, node in enumerate(windows.node_ids):
            hw = windows.hw_class[i]
            if not hw or node in near or not windows.streamed[i] or not windows.current[i]:
                continue
            xs, masks, nodes = found.setdefault(hw, ([], [], set()))
            xs.append(windows.x[i])
            masks.append(windows.mask[i])
            nodes.add(node)
    return {hw: (np.stack(xs), np.stack(masks), nodes) for hw, (xs, masks, nodes) in found.items()}


def old_episodes(meta: ModelMeta, seed: int) -> Any:
    from stethoscope_training import episodes

    return episodes.generate(seed, REHEARSAL_EPISODES_PER_FAMILY)


def calibrate(
    meta: ModelMeta, store: Store, days: float, old: Any, faults: list[Fault], out: FromStore
) -> dict:
    """Learn the normalisation of each class the model lacks; returns the store's healthy windows."""
    from stethoscope_training.finetune import matched_normalisation
    from stethoscope_training.train import normalisation_of

    healthy = healthy_windows(store, days, faults, meta)
    reference = np.flatnonzero((old.split == "train") & (old.label == 0))
    old_healthy = normalisation_of(old.x[reference], old.mask[reference], old.hw_class[reference])["default"]
    for hw, (x, mask, nodes) in sorted(healthy.items()):
        if hw in meta.normalisation and not meta.calibrated(hw):
            continue
        if len(x) < MIN_WINDOWS:
            out.too_few[hw] = len(x)
            continue
        own = normalisation_of(x, mask, np.full(len(x), ""))["default"]
        meta.normalisation[hw] = matched_normalisation(meta.norm_for(""), own, old_healthy)
        meta.calibration[hw] = {
            "source": "self-calibrated",
            "windows": len(x),
            "nodes": len(nodes),
            "at": iso(now_ms()),
        }
        out.calibrated.append(Calibrated(hw, len(x), len(nodes)))
    return healthy


def _scratch(store: Store) -> Store:
    scratch = copy.copy(store)
    scratch.database = f"{store.database}_finetune_scratch"
    store.command(f"DROP DATABASE IF EXISTS {scratch.database}")
    for statement in single_node_ddl(scratch.database, raw_ttl_days=SCRATCH_TTL_DAYS):
        store.command(statement)
    return scratch


def class_of_layer(layer: str) -> int:
    for name, layers in CLASS_LAYERS.items():
        if layer in layers:
            return CLASSES.index(name)
    raise ModelError(f"fault layer {layer!r} is not one the model classifies")


def fault_windows(store: Store, faults: list[Fault], meta: ModelMeta, out: FromStore) -> Windows | None:
    """The recorded faults' windows (from fault_windows), labels in `Windows.job` replaced by the
    class index; None when none could be read."""
    xs, masks, labels, classes = [], [], [], []
    scratch = _scratch(store)
    try:
        for fault in faults:
            store.command(f"TRUNCATE TABLE {scratch.database}.metrics")
            replay_window(store, fault, scratch.database)
            hw = hw_classes(store, [fault.node_id], True)[0]
            read = 0
            for offset in FAULT_OFFSETS_MS:
                w = read_windows(scratch, fault.impact_ms - offset, [fault.node_id], tuple(meta.features))
                if not w.streamed[0] or w.mask[0].max(initial=0.0) == 0:
                    continue
                xs.append(w.x[0])
                masks.append(w.mask[0])
                labels.append(class_of_layer(fault.layer))
                classes.append(hw)
                read += 1
            if read:
                out.faults += 1
                out.fault_windows += read
            else:
                out.unreadable.append(f"{fault.node_id} {fault.kind} {iso(fault.impact_ms)}")
    finally:
        store.command(f"DROP DATABASE IF EXISTS {scratch.database}")
    if not xs:
        return None
    return Windows([str(label) for label in labels], np.stack(xs), np.stack(masks), classes, [""] * len(xs))


def _accuracy(
    meta: ModelMeta, x: np.ndarray, mask: np.ndarray, classes: list[str], labels: np.ndarray
) -> dict:
    from stethoscope.model.decide import decide
    from stethoscope.model.features import normalise
    from stethoscope_training import evaluate

    probs = evaluate.Graphs(meta).classify(normalise(x, mask, meta, classes), mask.astype(np.float32))
    said = decide(probs, meta.thresholds, meta.classes)
    return {"windows": len(labels), "accuracy": round(float(np.mean(said == labels)), 4)}


def finetune_from_faults(
    meta: ModelMeta, store: Store, out_dir: Path | None, days: float = 1.0, min_faults: int = MIN_FAULTS
) -> FromStore:
    """Calibrate the classes the model lacks, then (with min_faults faults or more) tune the heads;
    writes the model into out_dir, by default the state folder's models/ (never the package's)."""
    started = time.perf_counter()
    out = FromStore(needed=min_faults)
    faults = list_faults(store)
    old = old_episodes(meta, meta.seed)
    healthy = calibrate(meta, store, days, old, faults, out)
    tuned = fault_windows(store, faults, meta, out) if faults else None
    target_dir = out_dir or own_models_dir()
    if tuned is not None and out.faults >= min_faults:
        _tune(meta, tuned, healthy, old, target_dir, out)
    elif target_dir != meta.graph_path("classifier").parent:
        _copy_graphs(meta, target_dir)
    meta.path = target_dir / f"{meta.name}.json"
    out.seconds = time.perf_counter() - started
    from stethoscope_training.train import history_entry

    meta.history.append(
        history_entry(
            "finetune-from-faults",
            old,
            meta,
            out.seconds,
            calibrated=[c.hw_class for c in out.calibrated],
            faults=out.faults,
            fault_windows=out.fault_windows,
            tuned=out.tuned,
            before=out.before,
            after=out.after,
        )
    )
    meta.save(meta.path)
    out.path = meta.path
    return out


def _copy_graphs(meta: ModelMeta, target_dir: Path) -> None:
    import shutil

    target_dir.mkdir(parents=True, exist_ok=True)
    for role in ("classifier", "detector"):
        shutil.copy2(meta.graph_path(role), target_dir / meta.graphs[role])


def _tune(meta: ModelMeta, tuned: Windows, healthy: dict, old: Any, target_dir: Path, out: FromStore) -> None:
    from stethoscope.model.features import normalise
    from stethoscope_training.finetune import embeddings, rehearsal, train_heads, write_classifier
    from stethoscope_training.train import TrainConfig

    labels = np.array([int(label) for label in tuned.node_ids], dtype=np.int64)
    out.before = _accuracy(meta, tuned.x, tuned.mask, tuned.hw_class, labels)
    good_x = [x for x, _, _ in healthy.values()]
    good_m = [m for _, m, _ in healthy.values()]
    good_c = [hw for hw, (x, _, _) in healthy.items() for _ in range(len(x))]
    x = np.concatenate([tuned.x, *good_x]) if good_x else tuned.x
    mask = np.concatenate([tuned.mask, *good_m]) if good_m else tuned.mask
    classes = list(tuned.hw_class) + good_c
    mine = np.concatenate([labels, np.zeros(len(good_c), dtype=np.int64)])
    config = TrainConfig(epochs=300, lr=3e-3, seed=meta.seed)
    rehearsed = rehearsal(old, np.random.default_rng(config.seed))
    xn = np.concatenate(
        [
            normalise(x, mask, meta, classes),
            normalise(old.x[rehearsed], old.mask[rehearsed], meta, list(old.hw_class[rehearsed])),
        ]
    )
    masks = np.concatenate([mask, old.mask[rehearsed]]).astype(np.float32)
    all_labels = np.concatenate([mine, old.label[rehearsed]])
    # the store's windows weigh as much as all the rehearsed ones
    weights = np.concatenate([np.full(len(mine), len(rehearsed) / len(mine)), np.ones(len(rehearsed))])
    heads = train_heads(meta, embeddings(meta, xn, masks), all_labels, weights, config)
    target_dir.mkdir(parents=True, exist_ok=True)
    if target_dir != meta.graph_path("classifier").parent:
        import shutil

        shutil.copy2(meta.graph_path("detector"), target_dir / meta.graphs["detector"])
    write_classifier(
        meta, heads, target_dir / meta.graphs["classifier"], (xn[:256], masks[:256], heads["_probe"])
    )
    meta.path = target_dir / f"{meta.name}.json"
    out.after = _accuracy(meta, tuned.x, tuned.mask, tuned.hw_class, labels)
    out.tuned = True


def render(result: FromStore) -> str:
    lines = []
    for c in result.calibrated:
        lines.append(
            f"self-calibrated {c.hw_class}: normalisation from {c.windows} healthy windows of {c.nodes} nodes"
        )
    for hw, count in sorted(result.too_few.items()):
        lines.append(f"not calibrated {hw}: {count} healthy windows in the store, {MIN_WINDOWS} needed")
    lines.append(f"faults: {result.faults} with windows ({result.fault_windows} windows)")
    for fault in result.unreadable:
        lines.append(f"  no windows left for {fault}")
    if result.tuned:
        lines.append(
            f"tuned head1+head2: accuracy on the fault windows {result.before['accuracy']:.3f} -> "
            f"{result.after['accuracy']:.3f}"
        )
    else:
        lines.append(f"heads not tuned: {result.faults} faults with windows, {result.needed} needed")
    lines.append(f"wrote {result.path} in {result.seconds:.1f} s")
    return "\n".join(lines)
