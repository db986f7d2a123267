"""Rows neither stored nor spooled (the store out and the spool's disk full or read-only), held in
memory by a long-running writer (the collector, the callback) and handed to its next write.

Held rows are at risk: a crash loses them. The hold is bounded in rows (STETHOSCOPE_HOLD_ROWS, default
2,000,000); beyond the bound the oldest rows are dropped and counted as lost, never silently.
"""

from __future__ import annotations

import os

from stethoscope.store.batch import METRIC_COLUMNS, Batch
from stethoscope.store.dsn import ConfigError

DEFAULT_HOLD_ROWS = 2_000_000
# Beyond the bound metric rows go first, benchmark results (few and expensive) last.
_DROP_ORDER = ("facts", "nodes", "fingerprints", "rejected", "bench")


def hold_rows_limit(default: int = DEFAULT_HOLD_ROWS) -> int:
    """How many rows a writer may hold in memory: STETHOSCOPE_HOLD_ROWS where it is set, else `default`."""
    raw = os.environ.get("STETHOSCOPE_HOLD_ROWS", "").strip()
    if not raw:
        return default
    try:
        rows = int(raw)
    except ValueError:
        raise ConfigError(f"STETHOSCOPE_HOLD_ROWS={raw!r} is not a number of rows") from None
    if rows < 0:
        raise ConfigError(f"STETHOSCOPE_HOLD_ROWS={raw!r} must be 0 or more rows")
    return rows


def held_rows(batch: Batch) -> int:
    """Every row a batch carries, those set aside for rejected/ included."""
    return len(batch) + len(batch.rejected)


class Hold:
    def __init__(self, limit: int | None = None):
        self.limit = hold_rows_limit() if limit is None else limit
        self._batch = Batch()
        self.lost = 0  # rows dropped beyond the bound since the start

    @property
    def rows(self) -> int:
        """Rows held now: at risk until a write stores or spools them."""
        return held_rows(self._batch)

    def keep(self, batch: Batch) -> int:
        """Hold `batch` after what is held (it is kept, not copied); beyond the bound drop the oldest
        rows. Returns how many were dropped."""
        if self.rows:
            self._batch.extend(batch)
        else:
            self._batch = batch
        excess = self.rows - self.limit
        if excess <= 0:
            return 0
        _drop_oldest(self._batch, excess)
        self.lost += excess
        return excess

    def take(self) -> Batch:
        """Everything held, for the next write; the hold is empty after."""
        taken, self._batch = self._batch, Batch()
        return taken


def _drop_oldest(batch: Batch, rows: int) -> None:
    metrics = min(rows, len(batch.metrics))
    for name in METRIC_COLUMNS:
        del getattr(batch.metrics, name)[:metrics]
    rows -= metrics
    for name in _DROP_ORDER:
        dropped = min(rows, len(getattr(batch, name)))
        del getattr(batch, name)[:dropped]
        rows -= dropped
