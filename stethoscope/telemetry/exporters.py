"""The exporters a site already runs, read as sources: one table (rules/sources/exporters.yml) from
dcgm-exporter's, node_exporter's and smartctl_exporter's metric names to the catalog's, and the
mapping of one scrape of the Prometheus text format (parsed by prometheus_client's parser) into the
rows the collector stores. A name the table does not map is ignored and counted."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from stethoscope.catalog import Catalog, default_catalog
from stethoscope.paths import rules_dir
from stethoscope.store.batch import MetricColumns

EXPORTERS = ("dcgm", "node_exporter", "smartctl")
VALUE_KINDS = ("as_is", "xid")
XID_PREEXISTING = "gpu_xid_preexisting_total"  # as the kernel-log reader reports old XIDs
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ExporterTableError(ValueError):
    """The table does not load: the entry and what is wrong with it."""


class ExporterParseError(ValueError):
    """An exporter's answer is not the Prometheus text format."""


def table_path() -> Path:
    return rules_dir() / "sources" / "exporters.yml"


@dataclass(frozen=True)
class Entry:
    source: str
    metric: str  # a catalog name, or a template of one over the sample's labels
    device: str = ""  # a template over the sample's labels
    match: tuple[tuple[str, re.Pattern[str]], ...] = ()
    scale: float = 1.0
    value: str = "as_is"
    strip: str = ""  # a prefix taken off the device

    def takes(self, labels: dict[str, str]) -> bool:
        return all(pattern.fullmatch(labels.get(key, "")) for key, pattern in self.match)

    def device_of(self, labels: dict[str, str]) -> str:
        device = _fill(self.device, labels).removeprefix("/dev/")
        return device.removeprefix(self.strip) if self.strip else device

    def metric_of(self, labels: dict[str, str]) -> str:
        return _fill(self.metric, labels, lower=True)


def _fill(template: str, labels: dict[str, str], lower: bool = False) -> str:
    def value(found: re.Match[str]) -> str:
        text = labels.get(found[1], "")
        return text.lower() if lower else text

    return PLACEHOLDER.sub(value, template)


@dataclass
class Mapped:
    """One scrape's rows, and the samples not mapped, by the exporter's name."""

    rows: MetricColumns = field(default_factory=MetricColumns)
    unmapped: Counter = field(default_factory=Counter)


@dataclass
class ExporterTable:
    exporters: dict[str, list[Entry]]
    catalog: Catalog

    def map(
        self,
        exporter: str,
        text: str,
        node_id: str,
        ts_ms: int,
        last_xid: dict[tuple[str, str], int] | None = None,
    ) -> Mapped:
        """The catalog's rows of one scrape of `exporter` on `node_id`, stamped `ts_ms`. `last_xid`:
        the XID last seen per (node, device), kept by the caller from one scrape to the next (updated
        here); without it every XID is a first sighting."""
        by_source: dict[str, list[Entry]] = {}
        for entry in self.exporters.get(exporter, []):
            by_source.setdefault(entry.source, []).append(entry)
        seen = last_xid if last_xid is not None else {}
        mapped = Mapped()
        for sample in _samples(exporter, text):
            name, labels, value = sample
            entries = [e for e in by_source.get(name, []) if e.takes(labels)]
            rows = [
                row
                for e in entries
                if (row := self._row(e, labels, value, exporter, node_id, seen)) is not None
            ]
            taken = [row for row in rows if row[0] in self.catalog]
            if not entries or (rows and not taken):
                mapped.unmapped[name] += 1
            for metric, device, row_labels, row_value in taken:
                mapped.rows.append(node_id, metric, device, row_labels, row_value, ts_ms)
        return mapped

    @staticmethod
    def _row(
        entry: Entry,
        labels: dict[str, str],
        value: float,
        exporter: str,
        node_id: str,
        last_xid: dict[tuple[str, str], int],
    ) -> tuple[str, str, dict[str, str], float] | None:
        row_labels = {"source": exporter}
        device = entry.device_of(labels)
        metric = entry.metric_of(labels)
        if entry.value == "xid":
            if value != value:  # NaN: nothing read
                return None
            code, before = int(value), last_xid.get((node_id, device))
            last_xid[(node_id, device)] = code
            if code <= 0 or code == before:  # 0: no XID yet; the same code: the same XID, however old
                return None
            # the gauge holds the last XID, however long ago: its first sighting is pre-existing
            metric = metric if before is not None else XID_PREEXISTING
            row_labels["xid"] = str(code)
            value = 1.0
        return metric, device, row_labels, value * entry.scale


def _samples(exporter: str, text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name as the exporter printed it, labels, value) of every sample: the parser adds `_total` to
    a counter's samples that lack it (dcgm-exporter's DCGM_FI_DEV_PCIE_REPLAY_COUNTER)."""
    printed = {
        line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if not line.startswith("#")
    }
    try:
        return [
            (sample.name if sample.name in printed else family.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        ]
    except (ValueError, TypeError, IndexError) as exc:
        raise ExporterParseError(f"{exporter}: not the Prometheus text format: {exc}") from None


def load_table(path: Path | None = None, catalog: Catalog | None = None) -> ExporterTable:
    """The table at `path` (default rules/sources/exporters.yml); ExporterTableError naming the entry
    when an exporter, a field or a catalog name is not known."""
    path = path or table_path()
    catalog = catalog or default_catalog()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ExporterTableError(f"{path}: {exc}") from None
    exporters: dict[str, list[Entry]] = {}
    for exporter, items in (data.get("exporters") or {}).items():
        if exporter not in EXPORTERS:
            raise ExporterTableError(f"{path}: exporter {exporter!r}: not one of {', '.join(EXPORTERS)}")
        exporters[exporter] = [_entry(path, exporter, i, item, catalog) for i, item in enumerate(items or [])]
    return ExporterTable(exporters, catalog)


def _entry(path: Path, exporter: str, index: int, item: Any, catalog: Catalog) -> Entry:
    where = f"{path}: {exporter}[{index}]"
    known = {"source", "metric", "device", "match", "scale", "value", "strip"}
    if not isinstance(item, dict) or not {"source", "metric"} <= set(item) or set(item) - known:
        raise ExporterTableError(f"{where}: needs source and metric, and only {', '.join(sorted(known))}")
    metric = str(item["metric"])
    if "{" not in metric and metric not in catalog:
        raise ExporterTableError(f"{where}: metric {metric!r} is not in rules/metrics.yml")
    if item.get("value", "as_is") not in VALUE_KINDS:
        raise ExporterTableError(f"{where}: value {item['value']!r}: one of {', '.join(VALUE_KINDS)}")
    try:
        match = tuple((str(k), re.compile(str(v))) for k, v in (item.get("match") or {}).items())
        scale = float(item.get("scale", 1.0))
    except (re.error, TypeError, ValueError) as exc:
        raise ExporterTableError(f"{where}: {exc}") from None
    return Entry(
        str(item["source"]),
        metric,
        str(item.get("device", "")),
        match,
        scale,
        str(item.get("value", "as_is")),
        str(item.get("strip", "")),
    )


_DEFAULT: list[ExporterTable] = []


def default_table() -> ExporterTable:
    """The shipped table against the shipped catalog, read once."""
    if not _DEFAULT:
        _DEFAULT.append(load_table())
    return _DEFAULT[0]
