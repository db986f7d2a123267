"""Inserting rows so that one the store refuses costs that row only: when an insert is refused for its
data (a ClickHouse data error: a value it cannot parse, convert or hold, a CHECK constraint; or the
client failing to serialise a value), the rows are halved until the ones refused alone are found.

Any other error is the store's, not the rows' (too many parts, a memory limit, a timeout, a blip):
StoreBusy while it still answers, StoreError when it does not; no row is set aside and the caller
tries them all again later. A store that refuses every row is refusing the table, not the rows (a
missing table or column): that is the caller's failure to retry, never a reason to set every row
aside. The search is bounded, so a file of many bad rows costs a few dozen inserts, not one per row.
"""

from __future__ import annotations

from typing import Any

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import SchemaMissing, Store, StoreError
from stethoscope.store.dsn import redact
from stethoscope.store.rows import Refused

BUDGET = 64  # inserts one call may spend finding the refused rows


class RowsRefused(StoreError):
    """The store refused the rows as a whole (every row, or past the search's budget)."""


class StoreBusy(StoreError):
    """The store answers but refused the insert for its own state (too many parts, memory, a
    timeout): no row is at fault; they are all tried again later."""


def insert(store: Store, table: str, rows: list[dict[str, Any]]) -> None:
    if table == "metrics":
        store.insert_metrics(MetricColumns.from_rows(rows))
    else:
        store.insert_rows(table, rows)


def insert_salvaging(store: Store, table: str, rows: list[dict[str, Any]]) -> tuple[int, list[Refused]]:
    """(rows stored, rows refused with the store's reason). Raises StoreError when the store stops
    answering, StoreBusy when it refuses for its own state (no row is at fault in either), and
    RowsRefused when it takes none of them."""
    if not rows:
        return 0, []
    budget = [BUDGET]
    stored, refused = _halving(store, table, rows, budget)
    if len(refused) == len(rows):
        raise RowsRefused(refused[0][1])
    return stored, refused


def _halving(
    store: Store, table: str, rows: list[dict[str, Any]], budget: list[int]
) -> tuple[int, list[Refused]]:
    error = _attempt(store, table, rows, budget)
    if error is None:
        return len(rows), []
    if len(rows) == 1:
        return 0, [(rows[0], error)]
    if budget[0] <= 0:
        raise RowsRefused(f"{error} (and too many rows refused to find each)")
    middle = len(rows) // 2
    first = _halving(store, table, rows[:middle], budget)
    second = _halving(store, table, rows[middle:], budget)
    return first[0] + second[0], first[1] + second[1]


def _attempt(store: Store, table: str, rows: list[dict[str, Any]], budget: list[int]) -> str | None:
    budget[0] -= 1
    try:
        insert(store, table, rows)
    except SchemaMissing as exc:  # the table is missing, not the rows wrong
        raise RowsRefused(str(exc)) from None
    except (KeyError, TypeError, ValueError, OverflowError) as exc:  # building the columns failed
        return f"row refused: {type(exc).__name__} {exc}"
    except StoreError as exc:
        if exc.data_fault:
            return redact(exc)
        if store.answers():
            raise StoreBusy(redact(exc)) from None
        raise
    return None
