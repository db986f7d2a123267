"""The learned model's metadata (`rules/models/<name>.json`, docs/design.md "Learned diagnosis"): the
12 features and how each aggregates over a node's devices, their normalisation, the classes, the
per-class thresholds, the graphs beside it and the scores it was shipped with. A model of that name
that `model finetune` wrote into the state folder's models/ (paths.own_models_dir) is read first.

A missing or damaged model is a configuration error (exit 2), never "healthy": `ModelError` says
which file and what is wrong with it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.paths import models_dir as shipped_models_dir
from stethoscope.paths import own_models_dir

CLASSES = ("healthy", "communication", "storage", "compute")
STEPS = 120
STEP_SECONDS = 5
DEFAULT_NAME = "core12"


@dataclass(frozen=True)
class Feature:
    metric: str  # a catalog name
    agg: str  # over the node's devices (and a job's ranks on the node): max, min, sum, avg
    transform: str  # applied before normalisation: "linear" or "log1p" (heavy-tailed rates)
    layer: str  # the fault class it speaks for first: communication, storage, compute
    why: str


# The 12 of docs/design.md: every one travels in the 5-second stream (rules/telemetry.yml), so a
# node that streams fills all 120 steps; a node that is only swept gets its sweep rows resampled.
FEATURES = (
    Feature("gpu_temperature_celsius", "max", "linear", "compute", "the hottest GPU: cooling, slowdown"),
    Feature("gpu_power_watts", "sum", "linear", "compute", "power brake or a GPU that stopped working"),
    Feature("gpu_sm_clock_mhz", "min", "linear", "compute", "the slowest clock: throttle, straggler"),
    Feature("gpu_utilization_percent", "avg", "linear", "compute", "GPUs waiting on data or peers"),
    Feature(
        "pcie_aer_correctable_errors_per_second", "sum", "log1p", "communication", "PCIe link errors (AER)"
    ),
    Feature("ib_symbol_errors_per_second", "sum", "log1p", "communication", "a dirty cable or optic"),
    Feature("rdma_qps_dropped_per_second", "sum", "log1p", "communication", "RDMA receive drops"),
    Feature("ib_port_xmit_wait_per_second", "sum", "log1p", "communication", "congestion behind a switch"),
    Feature("disk_temperature_celsius", "max", "linear", "storage", "the hottest NVMe"),
    Feature("train_step_time_ms", "max", "log1p", "compute", "the job's step time on this node"),
    Feature(
        "train_allreduce_latency_ms", "max", "log1p", "communication", "the job's collective time per step"
    ),
    Feature("train_data_wait_ms", "max", "log1p", "storage", "time the step waited for input data"),
)
# counts of errors, not measures of how the node runs: the fleet-relative detector leaves them out
ERROR_COUNTERS = (
    "pcie_aer_correctable_errors_per_second",
    "ib_symbol_errors_per_second",
    "rdma_qps_dropped_per_second",
)


def detector_weights(features: tuple[Feature, ...] | list[Feature]) -> list[float]:
    """Per feature, 1 where the fleet-relative detector counts its gap, 0 for an error counter."""
    return [0.0 if f.metric in ERROR_COUNTERS else 1.0 for f in features]


class ModelError(ValueError):
    """The model's files are missing, unreadable or disagree with each other (exit 2)."""


@dataclass
class Normalisation:
    mean: list[float]
    std: list[float]


@dataclass
class ModelMeta:
    name: str
    features: list[Feature]
    normalisation: dict[str, Normalisation]  # "default" and one per hardware class where known
    thresholds: dict[str, float]  # communication, storage, compute, outlier
    classes: list[str] = field(default_factory=lambda: list(CLASSES))
    steps: int = STEPS
    step_seconds: int = STEP_SECONDS
    data: str = "synthetic"
    data_hash: str = ""
    seed: int = 0
    graphs: dict[str, str] = field(default_factory=dict)  # classifier, detector: file names beside it
    scores: dict[str, Any] = field(default_factory=dict)  # held-out scores, written by training
    history: list[dict[str, Any]] = field(default_factory=list)  # trainings and fine-tunings
    # classes whose normalisation was learned from their own healthy windows in the store (`model
    # finetune --from-faults`) -> {"source": "self-calibrated", windows, nodes, at}
    calibration: dict[str, dict[str, Any]] = field(default_factory=dict)
    path: Path | None = None  # where it was read from (not written)

    def calibrated(self, hw_class: str) -> str:
        """'self-calibrated' for a class whose normalisation the store's windows gave, else ''."""
        return str(self.calibration.get(hw_class, {}).get("source", ""))

    def norm_for(self, hw_class: str) -> Normalisation:
        return self.normalisation.get(hw_class) or self.normalisation["default"]

    def graph_path(self, role: str) -> Path:
        if self.path is None:
            raise ModelError(f"model {self.name}: metadata has no location")
        return self.path.parent / self.graphs[role]

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("path")
        if not data["calibration"]:  # a model without self-calibrated classes reads as it always did
            data.pop("calibration")
        return json.dumps(data, indent=2, sort_keys=False) + "\n"

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)
        self.path = path


def models_dir() -> Path:
    """The shipped models (where `model train` writes by default, in a checkout)."""
    return shipped_models_dir()


def metadata_path(name: str = DEFAULT_NAME, directory: Path | None = None) -> Path:
    """The model `name` in `directory`; without one, the fine-tuned one in the state folder where it
    is there, else the shipped one."""
    if directory is not None:
        return directory / f"{name}.json"
    own = own_models_dir() / f"{name}.json"
    return own if own.is_file() else models_dir() / f"{name}.json"


def _require(data: dict, key: str, kind: type, where: Path) -> Any:
    if key not in data:
        raise ModelError(f"{where}: no '{key}'")
    if not isinstance(data[key], kind):
        raise ModelError(f"{where}: '{key}' must be {kind.__name__}, not {type(data[key]).__name__}")
    return data[key]


def load(path: Path) -> ModelMeta:
    """Read and check a model's metadata and that its graphs are beside it."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelError(f"{path}: no such model (train one with `stethoscope model train`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: not a JSON object")
    try:
        features = [Feature(**f) for f in _require(data, "features", list, path)]
        norms = {
            k: Normalisation(list(v["mean"]), list(v["std"]))
            for k, v in _require(data, "normalisation", dict, path).items()
        }
    except (TypeError, KeyError) as exc:
        raise ModelError(f"{path}: malformed features or normalisation: {exc}") from None
    meta = ModelMeta(
        name=_require(data, "name", str, path),
        features=features,
        normalisation=norms,
        thresholds={k: float(v) for k, v in _require(data, "thresholds", dict, path).items()},
        classes=list(_require(data, "classes", list, path)),
        steps=int(data.get("steps", STEPS)),
        step_seconds=int(data.get("step_seconds", STEP_SECONDS)),
        data=str(data.get("data", "")),
        data_hash=str(data.get("data_hash", "")),
        seed=int(data.get("seed", 0)),
        graphs=dict(_require(data, "graphs", dict, path)),
        scores=dict(data.get("scores", {})),
        history=list(data.get("history", [])),
        calibration=dict(data.get("calibration", {})),
        path=path,
    )
    _check(meta, path)
    return meta


def _check(meta: ModelMeta, path: Path) -> None:
    width = len(meta.features)
    if "default" not in meta.normalisation:
        raise ModelError(f"{path}: normalisation has no 'default'")
    for key, norm in meta.normalisation.items():
        if len(norm.mean) != width or len(norm.std) != width:
            raise ModelError(f"{path}: normalisation '{key}' has not {width} means and stds")
        if any(s <= 0 for s in norm.std):
            raise ModelError(f"{path}: normalisation '{key}' has a std <= 0")
    if meta.classes[0] != "healthy":
        raise ModelError(f"{path}: the first class must be 'healthy', not {meta.classes[0]!r}")
    missing = [c for c in (*meta.classes[1:], "outlier") if c not in meta.thresholds]
    if missing:
        raise ModelError(f"{path}: no threshold for {', '.join(missing)}")
    for role in ("classifier", "detector"):
        if role not in meta.graphs:
            raise ModelError(f"{path}: graphs has no '{role}'")
        if not (path.parent / meta.graphs[role]).is_file():
            raise ModelError(f"{path}: graph {meta.graphs[role]} is not beside it")
