"""What one write carries: metric rows as columns, plus the few row-shaped tables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

METRIC_COLUMNS = ("node_id", "metric_name", "device", "labels", "value", "timestamp")


@dataclass
class MetricColumns:
    """Metric rows kept column by column, the shape the columnar insert takes without copying."""

    node_id: list[str] = field(default_factory=list)
    metric_name: list[str] = field(default_factory=list)
    device: list[str] = field(default_factory=list)
    labels: list[dict[str, str]] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    timestamp: list[int] = field(default_factory=list)  # epoch milliseconds

    def append(self, node_id: str, name: str, device: str, labels: dict, value: float, ts_ms: int) -> None:
        self.node_id.append(node_id)
        self.metric_name.append(name)
        self.device.append(device)
        self.labels.append(labels)
        self.value.append(value)
        self.timestamp.append(ts_ms)

    def extend(self, other: MetricColumns) -> None:
        for name in METRIC_COLUMNS:
            getattr(self, name).extend(getattr(other, name))

    def columns(self) -> list[list[Any]]:
        return [getattr(self, name) for name in METRIC_COLUMNS]

    def rows(self) -> list[dict[str, Any]]:
        return list(self.iter_rows())

    def iter_rows(self) -> Iterator[dict[str, Any]]:
        for values in zip(*self.columns(), strict=True):
            yield dict(zip(METRIC_COLUMNS, values, strict=True))

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]]) -> MetricColumns:
        batch = cls()
        for row in rows:
            batch.append(
                row["node_id"],
                row["metric_name"],
                row["device"],
                row["labels"],
                row["value"],
                row["timestamp"],
            )
        return batch

    def __len__(self) -> int:
        return len(self.value)


@dataclass
class Batch:
    metrics: MetricColumns = field(default_factory=MetricColumns)
    facts: list[dict[str, Any]] = field(default_factory=list)
    bench: list[dict[str, Any]] = field(default_factory=list)
    fingerprints: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    # what no table can take (a value that is not a finite number): {"table", "reason", "row"}
    rejected: list[dict[str, Any]] = field(default_factory=list)

    def __len__(self) -> int:
        return (
            len(self.metrics) + len(self.facts) + len(self.bench) + len(self.fingerprints) + len(self.nodes)
        )

    def extend(self, other: Batch) -> None:
        """Add `other`'s rows after these."""
        self.metrics.extend(other.metrics)
        for name in ("facts", "bench", "fingerprints", "nodes", "rejected"):
            getattr(self, name).extend(getattr(other, name))

    def take(self) -> Batch:
        """Hand over the content and leave this batch empty."""
        taken = Batch(self.metrics, self.facts, self.bench, self.fingerprints, self.nodes, self.rejected)
        self.metrics, self.facts, self.bench, self.fingerprints, self.nodes = MetricColumns(), [], [], [], []
        self.rejected = []
        return taken
