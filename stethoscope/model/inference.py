"""The shipped graphs run by onnxruntime (CPU, one batch for the fleet; docs/design.md "Learned
diagnosis"): the classifier's probabilities, and the detector's distance of each node from its peers.
onnxruntime and numpy only: torch is for training. The one loader and the one peer-window
construction: evaluation (stethoscope_training) scores with these, not copies of them.

Peers: the nodes of the same hardware class running the same job at the same time
(nodes without a job: the same class, no job). A group under 3 nodes gets no outlier score: with one
or two others there is no "usual" to stand out from."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stethoscope.model.metadata import ModelError, ModelMeta, load
from stethoscope.model.robust import nanmedian

MIN_PEERS = 3  # a group's size, the node included
EXACT_UP_TO = 8  # groups up to this size get each node's median without it; larger ones the group's
THREADS = 2
BATCH = 1024  # rows per graph run: an evaluation's tens of thousands of episodes, in pieces


@dataclass
class Outliers:
    score: np.ndarray  # [N] float32, NaN where the node has no peer group
    deviation: np.ndarray  # [N, F] float32, 0 where it has none
    scored: np.ndarray  # [N] bool


class Graphs:
    """Both graphs of one model, checked against the inputs and outputs the runtime feeds and reads
    (a ModelError where onnxruntime cannot load one or it breaks that contract); loaded once per
    process by `graphs_for`."""

    def __init__(self, meta: ModelMeta):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # onnxruntime's warnings are not the user's business
        self.meta = meta
        self.sessions = {}
        digest = hashlib.sha256()
        for role in ("classifier", "detector"):
            path = meta.graph_path(role)
            try:
                digest.update(path.read_bytes())
                self.sessions[role] = ort.InferenceSession(
                    str(path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises its own types for a damaged or foreign graph
                raise ModelError(f"{path}: onnxruntime cannot load the {role}: {exc}") from None
        if meta.path is not None and meta.path.is_file():  # training scores before it saves them
            digest.update(meta.path.read_bytes())
        self.version = digest.hexdigest()[:12]  # what exactly ran: both graphs and their metadata
        self._check()

    def _check(self) -> None:
        wanted = {
            "classifier": ({"x", "mask"}, {"probs"}),
            "detector": ({"x", "mask", "peer", "peer_mask"}, {"score", "deviation"}),
        }
        for role, (inputs, outputs) in wanted.items():
            session = self.sessions[role]
            have_in = {i.name for i in session.get_inputs()}
            have_out = {o.name for o in session.get_outputs()}
            if have_in != inputs or not outputs <= have_out:
                raise ModelError(
                    f"{self.meta.graph_path(role)}: the {role} takes {sorted(have_in)} and gives "
                    f"{sorted(have_out)}; expected {sorted(inputs)} -> {sorted(outputs)}"
                )

    def classify(self, x_norm: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """[N, steps, F] normalised windows and their mask -> [N, classes] probabilities."""
        session = self.sessions["classifier"]
        parts = [
            np.asarray(
                session.run(["probs"], {"x": _f32(x_norm[i : i + BATCH]), "mask": _f32(mask[i : i + BATCH])})[
                    0
                ]
            )
            for i in range(0, len(x_norm), BATCH)
        ]
        return (
            np.concatenate(parts).astype(np.float32)
            if parts
            else np.zeros((0, len(self.meta.classes)), np.float32)
        )

    def detect(
        self, x_norm: np.ndarray, mask: np.ndarray, peer: np.ndarray, peer_mask: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The detector on windows and their peers' (peer_windows): [N] scores and [N, F] deviations
        as the graph gives them (evaluation scores stand-in peers with it, `outlier` real ones)."""
        session = self.sessions["detector"]
        scores, deviations = [], []
        for i in range(0, len(x_norm), BATCH):
            feed = {"x": x_norm, "mask": mask, "peer": peer, "peer_mask": peer_mask}
            score, deviation = session.run(
                ["score", "deviation"], {k: _f32(v[i : i + BATCH]) for k, v in feed.items()}
            )
            scores.append(np.asarray(score, np.float32).reshape(-1))
            deviations.append(np.asarray(deviation, np.float32))
        if not scores:
            features = x_norm.shape[2] if x_norm.ndim == 3 else len(self.meta.features)
            return np.zeros(0, np.float32), np.zeros((0, features), np.float32)
        return np.concatenate(scores), np.concatenate(deviations)

    def outlier(self, x_norm: np.ndarray, mask: np.ndarray, hw_class: list[str], job: list[str]) -> Outliers:
        """Each node against the median of its peers, the whole fleet in one detector run."""
        count, features = len(x_norm), x_norm.shape[2] if x_norm.ndim == 3 else len(self.meta.features)
        score = np.full(count, np.nan, np.float32)
        deviation = np.zeros((count, features), np.float32)
        peer, peer_mask, scored = peer_windows(x_norm, mask, peer_groups(hw_class, job))
        rows = np.flatnonzero(scored)
        if len(rows):
            got, dev = self.detect(x_norm[rows], mask[rows], peer[rows], peer_mask[rows])
            score[rows] = np.maximum(got, 0.0)
            deviation[rows] = np.maximum(dev, 0.0)
        return Outliers(score, deviation, scored)


def _f32(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32)


def peer_groups(hw_class: list[str], job: list[str]) -> list[list[int]]:
    """Indexes of the nodes that are each other's peers (same class, same job); groups of at least
    MIN_PEERS only. A node of unknown class ("") has no peers: it may be anything."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, key in enumerate(zip(hw_class, job, strict=True)):
        if key[0]:
            groups.setdefault(key, []).append(index)
    return [members for _, members in sorted(groups.items()) if len(members) >= MIN_PEERS]


def peer_windows(
    x_norm: np.ndarray, mask: np.ndarray, groups: list[list[int]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node the elementwise median of its peers' observed values, every feature (a job's too: its
    ranks share its step pattern), peer_mask 0 where no peer observed that step and feature. Up to
    EXACT_UP_TO nodes the node itself is left out; in a larger group one node moves the group's median
    by at most one rank, and one median serves them all."""
    peer = np.zeros_like(x_norm, dtype=np.float32)
    peer_mask = np.zeros_like(mask, dtype=np.float32)
    scored = np.zeros(len(x_norm), bool)
    for members in groups:
        values = np.where(mask[members] > 0, x_norm[members], np.nan).astype(np.float32)
        if len(members) <= EXACT_UP_TO:
            size = len(members)
            # row i: every member but i, all groups' medians in one call
            others = np.array([[j for j in range(size) if j != i] for i in range(size)])
            median = nanmedian(values[others], axis=1)
        else:
            median = nanmedian(values, axis=0)
        peer[members], peer_mask[members] = np.nan_to_num(median), ~np.isnan(median)
        scored[members] = True
    return peer, peer_mask, scored


_CACHE: dict[tuple[Path, float, float, float], Graphs] = {}
_LOCK = threading.Lock()


def graphs_for(meta: ModelMeta) -> Graphs:
    """The model's sessions, loaded once per process and again only when a file changed (watch and
    serve cycle for days; a retrained model is picked up without a restart)."""
    if meta.path is None:
        raise ModelError(f"model {meta.name}: metadata has no location")
    try:
        key = (
            meta.path,
            meta.path.stat().st_mtime,
            meta.graph_path("classifier").stat().st_mtime,
            meta.graph_path("detector").stat().st_mtime,
        )
    except OSError as exc:
        raise ModelError(f"{exc.filename}: {exc.strerror}") from None
    with _LOCK:
        graphs = _CACHE.get(key)
        if graphs is None:
            # files changed under a running watch or serve (retrained, fine-tuned): the graphs and
            # their metadata (normalisation, thresholds) are read again together
            changed = any(cached[0] == meta.path for cached in _CACHE)
            _CACHE.clear()
            graphs = _CACHE[key] = Graphs(load(meta.path) if changed else meta)
        return graphs
