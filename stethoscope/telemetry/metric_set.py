"""rules/telemetry.yml: the stream's metric sets, checked against the catalog and rendered to JSON.

The JSON rendering is what the push_agent role copies to a node (the node has no YAML): the agent
and the collector read the same slots, so a datagram's values map back to catalog names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stethoscope.bounded_yaml import RULE_FILE_MAX_BYTES, load_bounded
from stethoscope.catalog import Catalog, default_catalog
from stethoscope.paths import rules_dir
from stethoscope.telemetry import wire

PARTS = ("node", "gpu", "job")
AGGREGATES = ("max", "min", "sum", "avg", "or")


class MetricSetError(ValueError):
    pass


@dataclass(frozen=True)
class Slot:
    metric: str
    read: str
    unit: str
    agg: str | None = None


@dataclass(frozen=True)
class MetricSet:
    name: str
    id: int
    version: int
    period: float
    parts: dict[str, tuple[Slot, ...]]

    def slots(self, part: int) -> tuple[Slot, ...]:
        """The slots of a datagram's part number: 0 node, JOB_PART job, otherwise a GPU."""
        if part == wire.NODE_PART:
            return self.parts.get("node", ())
        if part == wire.JOB_PART:
            return self.parts.get("job", ())
        return self.parts.get("gpu", ())

    def names(self, part: int) -> list[str]:
        """The metric names of a part's slots, in order."""
        return [slot.metric for slot in self.slots(part)]

    def render(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "version": self.version,
            "period": self.period,
            "parts": {
                part: [{k: v for k, v in vars(slot).items() if v is not None} for slot in slots]
                for part, slots in self.parts.items()
            },
        }


def default_path() -> Path:
    return rules_dir() / "telemetry.yml"


def load_sets(path: str | Path | None = None, catalog: Catalog | None = None) -> dict[str, MetricSet]:
    path = Path(path) if path else default_path()
    catalog = catalog or default_catalog()
    try:
        data = load_bounded(path, RULE_FILE_MAX_BYTES, "metric set file") or {}
    except (OSError, yaml.YAMLError) as exc:
        raise MetricSetError(f"{path}: {exc}") from None
    entries = data.get("sets") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise MetricSetError(f"{path}: expected a list under `sets`")
    sets: dict[str, MetricSet] = {}
    ids: dict[int, str] = {}
    for index, entry in enumerate(entries):
        metric_set = _parse_set(path, index, entry, catalog)
        if metric_set.name in sets:
            raise MetricSetError(f"{path}: set {metric_set.name!r} defined twice")
        if metric_set.id in ids:
            raise MetricSetError(
                f"{path}: sets {ids[metric_set.id]!r} and {metric_set.name!r} share id {metric_set.id}"
            )
        ids[metric_set.id] = metric_set.name
        sets[metric_set.name] = metric_set
    return sets


def _parse_set(path: Path, index: int, entry: Any, catalog: Catalog) -> MetricSet:
    where = f"{path}: sets[{index}]"
    if not isinstance(entry, dict):
        raise MetricSetError(f"{where}: expected a mapping")
    name, set_id, version, period = (entry.get(k) for k in ("name", "id", "version", "period"))
    if not isinstance(name, str) or not name:
        raise MetricSetError(f"{where}: `name` is required")
    where = f"{path}: set {name}"
    if not isinstance(set_id, int) or isinstance(set_id, bool) or not 0 < set_id < 2**16:
        raise MetricSetError(f"{where}: `id` must be an integer 1..65535, not {set_id!r}")
    if not isinstance(version, int) or version < 1:
        raise MetricSetError(f"{where}: `version` must be a positive integer")
    if not isinstance(period, int | float) or period <= 0:
        raise MetricSetError(f"{where}: `period` must be a positive number of seconds")
    parts = entry.get("parts")
    if not isinstance(parts, dict) or "node" not in parts:
        raise MetricSetError(f"{where}: `parts` must hold at least `node`")
    parsed: dict[str, tuple[Slot, ...]] = {}
    for part, slots in parts.items():
        if part not in PARTS:
            raise MetricSetError(f"{where}: unknown part {part!r} (expected one of {', '.join(PARTS)})")
        if not isinstance(slots, list) or not 0 < len(slots) <= wire.MAX_VALUES:
            raise MetricSetError(f"{where}: part {part}: 1 to {wire.MAX_VALUES} slots")
        parsed[part] = tuple(
            _parse_slot(f"{where}: part {part} slot {n}", slot, catalog, part) for n, slot in enumerate(slots)
        )
    return MetricSet(name, set_id, version, float(period), parsed)


def _parse_slot(where: str, slot: Any, catalog: Catalog, part: str) -> Slot:
    if not isinstance(slot, dict):
        raise MetricSetError(f"{where}: expected a mapping")
    metric, read, unit, agg = (slot.get(k) for k in ("metric", "read", "unit", "agg"))
    spec = catalog.get(metric) if isinstance(metric, str) else None
    if spec is None:
        raise MetricSetError(f"{where}: metric {metric!r} is not in the catalog")
    if unit != spec.unit:
        raise MetricSetError(f"{where}: {metric}: unit {unit!r}, the catalog says {spec.unit!r}")
    if spec.kind != "gauge":
        raise MetricSetError(f"{where}: {metric} is a {spec.kind}: send its rate (a `_per_second` name)")
    if not isinstance(read, str) or not read:
        raise MetricSetError(f"{where}: `read` is required")
    if part == "node" and agg not in AGGREGATES:
        raise MetricSetError(f"{where}: node slots need `agg`, one of {', '.join(AGGREGATES)}")
    if part != "node" and agg is not None:
        raise MetricSetError(f"{where}: `agg` belongs to node slots only")
    return Slot(str(metric), read, unit, agg)


def render_json(metric_set: MetricSet) -> str:
    return json.dumps(metric_set.render(), indent=1, sort_keys=True) + "\n"
