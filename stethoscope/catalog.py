"""The metric catalog, rules/metrics.yml: name -> unit, kind, better direction, report interval."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from stethoscope.paths import project_root

KINDS = ("gauge", "counter", "events")  # events: the events slice owns its semantics
DIRECTIONS = ("higher", "lower", "none")
SWEEP_INTERVAL = 60  # what the catalog assumes for metrics the Ansible sweeps report


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    kind: str
    better: str
    interval: int
    help: str = ""


class CatalogError(ValueError):
    pass


class Catalog:
    def __init__(self, metrics: dict[str, MetricSpec], families: dict[str, MetricSpec]):
        self.metrics = metrics
        self.families = families

    def get(self, name: str) -> MetricSpec | None:
        if name in self.metrics:
            return self.metrics[name]
        for prefix, spec in self.families.items():
            if name.startswith(prefix) and len(name) > len(prefix):
                return MetricSpec(name, spec.unit, spec.kind, spec.better, spec.interval, spec.help)
        return None

    def with_intervals(self, sweep: Any = None, per_metric: Any = None) -> Catalog:
        """This catalog as an inventory reports it: `sweep` seconds for every metric the Ansible sweeps
        report (interval SWEEP_INTERVAL in the catalog), `per_metric` {name: seconds} over that."""
        if per_metric is not None and not isinstance(per_metric, dict):
            raise CatalogError(
                f"stethoscope_metric_intervals must be a mapping of metric to seconds, not {per_metric!r}"
            )
        overrides = dict(per_metric or {})
        for name, seconds in [("stethoscope_sweep_interval", sweep), *overrides.items()]:
            if seconds is not None and (
                isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0
            ):
                raise CatalogError(f"{name}: an interval is a positive number of seconds, not {seconds!r}")
        unknown = sorted(name for name in overrides if name not in self)
        if unknown:
            raise CatalogError(
                f"stethoscope_metric_intervals names metrics not in the catalog: {', '.join(unknown)}"
            )

        def interval(spec: MetricSpec) -> MetricSpec:
            seconds = overrides.get(spec.name) or (
                sweep if spec.interval == SWEEP_INTERVAL and sweep else None
            )
            return replace(spec, interval=int(seconds)) if seconds else spec

        metrics = {name: interval(spec) for name, spec in self.metrics.items()}
        for name in overrides:  # a member of a family (smart_*) gets an entry of its own
            spec = self.get(name)
            if name not in metrics and spec is not None:
                metrics[name] = interval(spec)
        return Catalog(metrics, {prefix: interval(spec) for prefix, spec in self.families.items()})

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        path = Path(path) if path else default_path()
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise CatalogError(f"{path}: {exc}") from None
        return cls(_specs(path, data.get("metrics") or {}), _specs(path, data.get("families") or {}))


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
        interval = entry.get("interval")
        if not isinstance(interval, int) or interval <= 0:
            raise CatalogError(f"{path}: {name}: interval must be a positive number of seconds")
        specs[name] = MetricSpec(
            name, str(entry.get("unit", "")), kind, better, interval, entry.get("help", "")
        )
    return specs


def default_path() -> Path:
    return project_root() / "rules" / "metrics.yml"


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    return Catalog.load()
