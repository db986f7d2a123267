"""Training data for the learned diagnosis: labelled 10-minute windows of one node at 5 s (docs/design.md
"Learned diagnosis"), numpy only and deterministic for a seed. The signals and their families are
in stethoscope_training.families.

The test split holds whole fault families no train or validation episode comes from (HELD_OUT) and
healthy windows replayed from the real capture itself (its 2 Hz samples read every 5 s, as the
agent reads them), so the scores measure the model rather than the generator.

x and mask are what `features.read_windows` returns for the same rows: a lost sample is carried
forward while younger than the hold (STREAM_CARRY steps), then masked; never zero-filled.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stethoscope.model.metadata import CLASSES, FEATURES, STEP_SECONDS, STEPS
from stethoscope_training import families, families_composed, families_healthy_variety
from stethoscope_training.families import (
    CAPTURE,
    GPUS,
    HELD_OUT,
    REPLAYED,
    REPLAYED_TRAINING,
    RULES_MISS,
    Capture,
    EpisodesError,
    F,
    Hardware,
    Window,
    replay,
    shifted,
)
from stethoscope_training.retired_holdouts import (
    set01,
    set02,
    set03,
    set04,
    set05,
    set06,
    set07,
    set08,
    set09,
    set10,
    set11,
    set12,
    set13,
)

__all__ = [
    "FAMILIES",
    "GPUS",
    "HELD_OUT",
    "REPLAYED",
    "REPLAYED_TRAINING",
    "Capture",
    "Episodes",
    "EpisodesError",
    "generate",
    "load",
]
# 2: fresh set 1's families in training, wider step/collective/input shares, jobs that report
# only their step time (the Reporter's default); 3: fresh set 2's families and healthy variety
# (families_healthy_variety) in training; 4: fresh set 3's families in training; 5: fresh set 4's;
# 6: fresh set 5's, and a trickle of correctable PCIe errors in a share of most families' episodes;
# 7: fresh set 6's, and healthy work that combines two to four benign changes (families_composed);
# 8: fresh set 7's; 9: fresh set 8's; 10: fresh set 9's, and windows replayed from the capture's
# earlier half in training (the test split's replay its later half); 11: fresh sets 10 and 11's
# (both scored the model of version 10); 12: fresh set 12's (it scored version 11); 13: fresh set 13's
# (it scored version 12)
GENERATOR_VERSION = 13
FAMILIES = {
    **families.CORE_FAMILIES,
    **set01.SET1,
    **set02.SET2,
    **set03.SET3,
    **set04.SET4,
    **set05.SET5,
    **set06.SET6,
    **set07.SET7,
    **set08.SET8,
    **set09.SET9,
    **set10.SET10,
    **set11.SET11,
    **set12.SET12,
    **set13.SET13,
    **families_healthy_variety.HEALTHY_VARIETY,
    **families_composed.COMPOSED,
}
# a job that reports its step time only (Reporter.step without comm_time/data_time)
STEP_TIME_ONLY = 0.15
# a stream sample at phase 0.5..4.5 s before a step's end stays valid for 15 s: two more steps
STREAM_CARRY = 2
NODE_FEATURES = [i for i, f in enumerate(FEATURES) if not f.metric.startswith("train_")]
JOB_FEATURES = [i for i, f in enumerate(FEATURES) if f.metric.startswith("train_")]
TIMING_FEATURES = [F["train_allreduce_latency_ms"], F["train_data_wait_ms"]]
VALIDATION_SHARE = 0.2
# Fresh set 5 read a drive's PCIe link errors as a communication fault: in training only
# communication faults counted correctable PCIe errors. A node's AER sum covers the links of its
# NICs, GPUs and drives alike, and a trickle costs nothing; so a share of the episodes of every
# family but the rules-miss ones (whose own node is clean by definition) and the replays, healthy
# ones too, counts 0.2-5 a second from some step on, and what got slower tells the class.
AER_TRICKLE_SHARE = 0.1
SPLITS = ("train", "validation", "test")


@dataclass
class Episodes:
    x: np.ndarray  # float32 [E, STEPS, 12], NaN where masked
    mask: np.ndarray  # float32 [E, STEPS, 12]
    label: np.ndarray  # int64 [E]
    family: np.ndarray  # <U64 [E]
    split: np.ndarray  # <U16 [E]
    hw_class: np.ndarray  # <U32 [E]
    onset: np.ndarray  # int64 [E], -1 healthy
    severity: np.ndarray  # float32 [E]
    info: dict

    def __len__(self) -> int:
        return len(self.label)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in ARRAYS}

    def data_hash(self) -> str:
        return data_hash(self.arrays())

    def to_rows(self, i: int, node_id: str, end_ms: int) -> list[dict]:
        """Episode i as the stream collector stores it: the node part's rows (device "node", labels
        source=stream and the slot's agg) and the job part's (device "job", labels job and rank), one
        sample per observed step at a phase before the step's end; a window of 120 steps ending at
        end_ms (step k ends at end_ms - (119 - k) * 5 s)."""
        phase = 500 + (int(hashlib.sha256(node_id.encode()).hexdigest()[:6], 16) % 4000)
        job = f"{700000 + i}"
        rows = []
        x, mask = self.x[i], self.mask[i]
        sent = mask > 0
        # the steps before a gap were carried, not sent (a gap starts STREAM_CARRY steps after the
        # last sample); a carried step inside a run may be sent: the same value, the same read
        ends = np.argwhere((mask[:-1] > 0) & (mask[1:] == 0))
        for back in range(STREAM_CARRY):
            before = ends[:, 0] - back
            sent[before[before >= 0], ends[before >= 0, 1]] = False
        for k in range(STEPS):
            ts = end_ms - (STEPS - 1 - k) * STEP_SECONDS * 1000 - phase
            for f in np.flatnonzero(sent[k]):
                feature = FEATURES[f]
                if f in JOB_FEATURES:
                    device, labels = "job", {"source": "stream", "job": job, "rank": "0"}
                else:
                    device, labels = "node", {"source": "stream", "agg": feature.agg}
                rows.append(
                    {
                        "node_id": node_id,
                        "metric_name": feature.metric,
                        "device": device,
                        "labels": labels,
                        "value": float(x[k, f]),
                        "timestamp": ts,
                    }
                )
        return rows


ARRAYS = ("x", "mask", "label", "family", "split", "hw_class", "onset", "severity")


def data_hash(arrays: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in ARRAYS:
        value = np.ascontiguousarray(arrays[name])
        digest.update(f"{name}:{value.dtype.str}:{value.shape}".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def assemble(w: Window) -> tuple[np.ndarray, np.ndarray]:
    """Aggregate a window as the node part does, lose samples, carry and mask as read_windows does."""
    rng, n = w.rng, w.n
    values = w.node.copy()
    values[:, :, F["gpu_temperature_celsius"]] = w.temp.max(axis=2)
    values[:, :, F["gpu_power_watts"]] = np.round(w.power.sum(axis=2), 2)
    values[:, :, F["gpu_sm_clock_mhz"]] = w.clock.min(axis=2)
    values[:, :, F["gpu_utilization_percent"]] = w.util.mean(axis=2)
    values[:, :, F["train_step_time_ms"]] = w.step_ms
    values[:, :, F["train_allreduce_latency_ms"]] = w.comm_ms
    values[:, :, F["train_data_wait_ms"]] = w.data_ms
    values = values.astype(np.float32)  # the wire carries float32
    loss = rng.choice([0.0, 0.003, 0.01, 0.03], n)[:, None]
    node_seen = rng.random((n, STEPS)) >= loss
    long_gap = rng.random(n) < 0.05  # now and then the node goes quiet for a while
    gap_start = rng.integers(0, STEPS, n)[:, None]
    gap_len = rng.integers(4, 30, n)[:, None]
    t = np.arange(STEPS)[None, :]
    node_seen &= ~(long_gap[:, None] & (t >= gap_start) & (t < gap_start + gap_len))
    job_seen = w.job & (rng.random((n, STEPS)) >= loss)
    step_only = rng.random(n) < STEP_TIME_ONLY
    seen = np.empty(values.shape, dtype=bool)
    seen[:, :, NODE_FEATURES] = node_seen[:, :, None]
    seen[:, :, JOB_FEATURES] = job_seen[:, :, None]
    seen[:, :, TIMING_FEATURES] &= ~step_only[:, None, None]
    return carry(values, seen, STREAM_CARRY)


def carry(values: np.ndarray, seen: np.ndarray, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The last seen value carried forward for at most `steps` steps along axis 1, else NaN/masked."""
    t = np.arange(values.shape[1])[None, :, None]
    last = np.maximum.accumulate(np.where(seen, t, -(10**6)), axis=1)
    valid = (t - last) <= steps
    index = np.clip(last, 0, None)
    x = np.take_along_axis(values, np.broadcast_to(index, values.shape), axis=1)
    x = np.where(valid, x, np.nan).astype(np.float32)
    return x, valid.astype(np.float32)


def hardware(
    hw_class: str, per_family: int, capture: Capture | None = None
) -> tuple[Capture, Hardware, Hardware]:
    """(the capture, the H200 calibrated on it, the hardware asked for), the arguments checked."""
    if hw_class not in ("h200", "shifted"):
        raise EpisodesError(f"unknown hardware class {hw_class!r} (h200 or shifted)")
    if per_family < 1:
        raise EpisodesError("per_family must be at least 1")
    capture = capture or Capture.read()
    h200 = capture.h200()
    return capture, h200, h200 if hw_class == "h200" else shifted(h200)


def manifest(seed: int, hw_class: str, hw: Hardware) -> dict:
    """What every episode set records of how it was made (episodes.json)."""
    return {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "hw_class": hw_class,
        "hardware": hw.__dict__,
        "features": [f.metric for f in FEATURES],
        "classes": list(CLASSES),
        "steps": STEPS,
        "step_seconds": STEP_SECONDS,
        "gpus_per_node": GPUS,
    }


def generate(
    seed: int = 7, per_family: int = 200, hw_class: str = "h200", capture: Capture | None = None
) -> Episodes:
    capture, h200, hw = hardware(hw_class, per_family, capture)
    root = np.random.SeedSequence([seed, 0 if hw_class == "h200" else 1])
    names = [*FAMILIES, *REPLAYED_TRAINING, *REPLAYED]
    streams = root.spawn(len(names))
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ARRAYS}
    counts = {}
    for name, stream in zip(names, streams, strict=True):
        rng = np.random.default_rng(stream)
        if name in REPLAYED or name in REPLAYED_TRAINING:
            load, early = "load" in name, name in REPLAYED_TRAINING
            cls, window = "healthy", replay(rng, hw, h200, capture, per_family, load, early)
        else:
            cls, family = FAMILIES[name]
            window = family(rng, hw, per_family)
            if name not in RULES_MISS:  # those look normal on their own node, by definition
                _aer_trickle(window, np.random.default_rng(stream.spawn(1)[0]))
        x, mask = assemble(window)
        if name in HELD_OUT or name in REPLAYED:
            split = np.full(per_family, "test")
        else:
            split = np.where(rng.random(per_family) < VALIDATION_SHARE, "validation", "train")
        parts["x"].append(x)
        parts["mask"].append(mask)
        parts["label"].append(np.full(per_family, CLASSES.index(cls), dtype=np.int64))
        parts["family"].append(np.full(per_family, name, dtype="<U64"))
        parts["split"].append(split.astype("<U16"))
        parts["hw_class"].append(np.full(per_family, hw.hw_class, dtype="<U32"))
        parts["onset"].append(window.onset.astype(np.int64))
        parts["severity"].append(window.severity.astype(np.float32))
        counts[name] = per_family
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    splits = {s: sorted(set(arrays["family"][arrays["split"] == s].tolist())) for s in SPLITS}
    info = {
        **manifest(seed, hw_class, hw),
        "per_family": counts,
        "families_per_split": splits,
        "held_out": list(HELD_OUT),
        "replayed_from": str(CAPTURE),
        "data_hash": data_hash(arrays),
    }
    return Episodes(**arrays, info=info)


def _aer_trickle(w: Window, rng: np.random.Generator) -> None:
    """AER_TRICKLE_SHARE of the window's episodes count correctable PCIe errors at 0.2-5 a second
    (bursty, in whole errors per 5-s period) from a step of their own on."""
    chosen = rng.random(w.n) < AER_TRICKLE_SHARE
    start = rng.integers(0, STEPS, (w.n, 1))
    level = 10 ** rng.uniform(-0.7, 0.7, (w.n, 1))
    on = chosen[:, None] & (np.arange(STEPS)[None, :] >= start)
    value = np.minimum(level * rng.lognormal(0, 0.5, (w.n, STEPS)), 2 * level) * on
    counted = np.rint(value * STEP_SECONDS) / STEP_SECONDS
    aer = F["pcie_aer_correctable_errors_per_second"]
    w.node[:, :, aer] = np.maximum(w.node[:, :, aer], counted)


def save(episodes: Episodes, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(directory / "episodes.npz", allow_pickle=False, **episodes.arrays())
    (directory / "episodes.json").write_text(json.dumps(episodes.info, indent=2) + "\n")


def load(directory: Path) -> Episodes:
    """Read DIR/episodes.npz and its JSON, checking the data hash (EpisodesError when they disagree)."""
    directory = Path(directory)
    npz, meta = directory / "episodes.npz", directory / "episodes.json"
    try:
        info = json.loads(meta.read_text())
        with np.load(npz, allow_pickle=False) as data:
            arrays = {k: data[k] for k in ARRAYS}
    except FileNotFoundError as exc:
        raise EpisodesError(f"{exc.filename}: no such file (write it with `tools/lab.py episodes`)") from None
    except (OSError, ValueError, KeyError) as exc:
        raise EpisodesError(f"{directory}: damaged episodes: {exc}") from None
    if not isinstance(info, dict) or info.get("data_hash") != data_hash(arrays):
        raise EpisodesError(f"{npz}: data hash differs from {meta}'s (regenerate the episodes)")
    return Episodes(**arrays, info=info)
