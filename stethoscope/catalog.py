"""The metric catalog, rules/metrics.yml: name -> unit, kind, better direction, layer, report interval;
and the kinds of device metrics are reported on (which device encloses which)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from stethoscope.aggregates import for_kind
from stethoscope.bounded_yaml import RULE_FILE_MAX_BYTES, load_bounded
from stethoscope.paths import rules_dir
from stethoscope.timeutil import DurationError, positive_seconds

KINDS = ("gauge", "counter", "events")
DIRECTIONS = ("higher", "lower", "none")
LAYERS = ("compute", "communication", "storage", "network", "job")
# The aggregates a rule may apply to each kind (docs/design.md "Metric catalog"); the first is the default.
AGGREGATES = {kind: for_kind(kind) for kind in KINDS}
SWEEP_INTERVAL = 60  # what the catalog assumes for metrics the Ansible sweeps report
STREAM_INTERVAL = 5  # the push stream's period (docs/design.md "Telemetry"; push_agent_period)
# A metric without a declared layer gets one from its name's prefix, so that every metric has one.
_LAYER_PREFIXES = (
    ("nvlink_", "communication"),
    ("bench_allreduce", "communication"),
    ("nccl_", "communication"),
    ("smart_", "storage"),
    ("nvme_", "storage"),
    ("disk_", "storage"),
    ("bench_fio", "storage"),
    ("ib_", "network"),
    ("rdma_", "network"),
    ("net_", "network"),
    ("bench_rdma", "network"),
    ("ansible_host_unreachable", "network"),
    ("telemetry_", "network"),
    ("train_", "job"),
    ("cuda_memory", "job"),
)


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    kind: str
    better: str
    interval: int
    help: str = ""
    layer: str = ""
    # the interval rules/metrics.yml declares, which a rule's author counted on (0: `interval` is it)
    authored: int = 0
    # why no shipped rule reads this metric (throughput, an inventory fact, read through another one)
    informational: str = ""

    @property
    def authored_interval(self) -> int:
        return self.authored or self.interval

    @property
    def streamed(self) -> bool:
        """Reported by the push stream only (declared at its period), never by a sweep."""
        return self.authored_interval <= STREAM_INTERVAL


@dataclass(frozen=True)
class DeviceKind:
    """A kind of device (gpu, nvlink, disk, ...): the metric name prefixes reported on it, the pattern
    its device names follow and the kind that encloses it (gpu2/link3 belongs to gpu2)."""

    name: str
    pattern: str
    prefixes: tuple[str, ...] = ()
    parent: str | None = None


def _interval_seconds(name: str, value: Any) -> int | None:
    """A report interval: seconds or a duration ('90s', '5m'), above 0, rounded up to whole seconds
    as the catalog keeps them; None stays None (not set)."""
    if value is None:
        return None
    try:
        return math.ceil(positive_seconds(value))
    except DurationError as exc:
        raise CatalogError(f"{name}: {exc}") from None


class CatalogError(ValueError):
    pass


class Catalog:
    def __init__(
        self,
        metrics: dict[str, MetricSpec],
        families: dict[str, MetricSpec],
        device_kinds: dict[str, DeviceKind] | None = None,
        stream_interval: int = STREAM_INTERVAL,
    ):
        self.metrics = metrics
        self.families = families
        self.device_kinds = device_kinds or {}
        self.stream_interval = stream_interval  # the agents' period: every `source=stream` series

    def interval_of(self, metric: str, stream: bool) -> int:
        """The declared report interval of `metric`'s series from the stream (`stream`) or the sweeps:
        the stream's period for a stream series or a metric only the stream reports, whatever the
        sweeps' interval; else the catalog's interval as the inventory sets it."""
        spec = self.get(metric)
        if spec is None:
            return SWEEP_INTERVAL
        return self.stream_interval if stream or spec.streamed else spec.interval

    def authored_interval_of(self, metric: str, stream: bool) -> int:
        """The interval rules/metrics.yml declares for that series: what a rule's author counted on."""
        spec = self.get(metric)
        if spec is None:
            return SWEEP_INTERVAL
        return STREAM_INTERVAL if stream or spec.streamed else spec.authored_interval

    def kind(self, name: str) -> str | None:
        spec = self.get(name)
        return spec.kind if spec else None

    def device_kind(self, metric: str) -> DeviceKind | None:
        """The kind of device `metric` is reported on (the longest matching prefix); None: the node."""
        best: tuple[int, DeviceKind] | None = None
        for kind in self.device_kinds.values():
            for prefix in kind.prefixes:
                if metric.startswith(prefix) and (best is None or len(prefix) > best[0]):
                    best = (len(prefix), kind)
        return best[1] if best else None

    def enclosing(self, metric: str) -> DeviceKind | None:
        """The outermost kind of device enclosing `metric`'s device (gpu for an NVLink link)."""
        kind = self.device_kind(metric)
        while kind is not None and kind.parent is not None:
            kind = self.device_kinds[kind.parent]
        return kind

    def get(self, name: str) -> MetricSpec | None:
        if name in self.metrics:
            return self.metrics[name]
        for prefix, spec in self.families.items():
            if name.startswith(prefix) and len(name) > len(prefix):
                return replace(spec, name=name)
        return None

    def with_intervals(self, sweep: Any = None, per_metric: Any = None, stream: Any = None) -> Catalog:
        """This catalog as an inventory reports it: `sweep` seconds for every metric the Ansible sweeps
        report (interval SWEEP_INTERVAL in the catalog), `per_metric` {name: seconds} over that, and
        `stream` seconds (push_agent_period) for every series of the stream. Sweep settings never
        apply to the stream's series (`interval_of`)."""
        if per_metric is not None and not isinstance(per_metric, dict):
            raise CatalogError(
                f"stethoscope_metric_intervals must be a mapping of metric to seconds, not {per_metric!r}"
            )
        sweep = _interval_seconds("stethoscope_sweep_interval", sweep)
        stream = _interval_seconds("push_agent_period", stream)
        overrides = {name: _interval_seconds(name, seconds) for name, seconds in (per_metric or {}).items()}
        unknown = sorted(name for name in overrides if name not in self)
        if unknown:
            raise CatalogError(
                f"stethoscope_metric_intervals names metrics not in the catalog: {', '.join(unknown)}"
            )

        def interval(spec: MetricSpec) -> MetricSpec:
            seconds = overrides.get(spec.name) or (
                sweep if spec.interval == SWEEP_INTERVAL and sweep else None
            )
            return replace(spec, interval=int(seconds), authored=spec.authored_interval) if seconds else spec

        metrics = {name: interval(spec) for name, spec in self.metrics.items()}
        for name in overrides:  # a member of a family (smart_*) gets an entry of its own
            spec = self.get(name)
            if name not in metrics and spec is not None:
                metrics[name] = interval(spec)
        families = {prefix: interval(spec) for prefix, spec in self.families.items()}
        return Catalog(metrics, families, self.device_kinds, int(stream or self.stream_interval))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        path = Path(path) if path else default_path()
        try:
            data = load_bounded(path, RULE_FILE_MAX_BYTES, "metric catalog") or {}
        except (OSError, yaml.YAMLError) as exc:
            raise CatalogError(f"{path}: {exc}") from None
        return cls(
            _specs(path, data.get("metrics") or {}),
            _specs(path, data.get("families") or {}),
            _device_kinds(path, data.get("device_kinds") or {}),
        )


def _specs(path: Path, entries: dict) -> dict[str, MetricSpec]:
    specs = {}
    for name, entry in entries.items():
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: {name}: expected a mapping")
        kind, better = entry.get("kind"), entry.get("better")
        if kind not in KINDS:
            raise CatalogError(f"{path}: {name}: kind must be one of {KINDS}, not {kind!r}")
        if better not in DIRECTIONS:
            raise CatalogError(f"{path}: {name}: better must be one of {DIRECTIONS}, not {better!r}")
        layer = entry.get("layer", "")
        if layer and layer not in LAYERS:
            raise CatalogError(f"{path}: {name}: layer must be one of {LAYERS}, not {layer!r}")
        interval = entry.get("interval")
        if not isinstance(interval, int) or interval <= 0:
            raise CatalogError(f"{path}: {name}: interval must be a positive number of seconds")
        informational = entry.get("informational", "")
        if not isinstance(informational, str) or ("informational" in entry and not informational.strip()):
            raise CatalogError(f"{path}: {name}: informational must be the reason no rule reads it, as text")
        specs[name] = MetricSpec(
            name,
            str(entry.get("unit", "")),
            kind,
            better,
            interval,
            entry.get("help", ""),
            layer,
            informational=informational.strip(),
        )
    return specs


def _device_kinds(path: Path, entries: dict) -> dict[str, DeviceKind]:
    kinds = {}
    for name, entry in entries.items():
        prefixes = entry.get("metrics", []) if isinstance(entry, dict) else None
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("pattern"), str)
            or not isinstance(prefixes, list)
            or not all(isinstance(p, str) for p in prefixes)
        ):
            raise CatalogError(
                f"{path}: device_kinds: {name}: expected "
                "{pattern: REGEX, metrics: [PREFIX, ...], parent: KIND}"
            )
        try:
            re.compile(entry["pattern"])
        except re.error as exc:
            raise CatalogError(f"{path}: device_kinds: {name}: pattern: {exc}") from None
        kinds[name] = DeviceKind(name, entry["pattern"], tuple(prefixes), entry.get("parent"))
    for kind in kinds.values():
        seen, parent = {kind.name}, kind.parent
        while parent is not None:
            if parent not in kinds or parent in seen:
                raise CatalogError(
                    f"{path}: device_kinds: {kind.name}: parent {parent!r} is not a kind above it"
                )
            seen.add(parent)
            parent = kinds[parent].parent
    return kinds


def default_path() -> Path:
    return rules_dir() / "metrics.yml"


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    return Catalog.load()


def layer_of(catalog: Catalog | None, metric: str) -> str:
    """The catalog layer of a metric (compute, communication, storage, network, job): the entry's own
    `layer` where it has one, else from the name's prefix."""
    spec = catalog.get(metric) if catalog is not None else None
    declared = getattr(spec, "layer", "") if spec else ""
    if declared in LAYERS:
        return declared
    for prefix, layer in _LAYER_PREFIXES:
        if metric.startswith(prefix):
            return layer
    return "compute"  # gpu_, pcie_, cpu_, numa_, bench_gemm, bench_fft, node_fingerprint
