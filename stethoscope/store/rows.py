"""Whether a row fits its table: every column there, each value of its column's type (text as text, a
finite number, a time the store can hold). The writer and the spool's replay check rows before they
insert, so one bad row is set aside alone, with its reason, instead of failing its batch or file.

The column types come from the table definitions (store.schema), so the check never drifts from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from functools import cache
from typing import Any

from stethoscope.names import is_device_name, is_metric_name, is_node_name, name_problem
from stethoscope.store.batch import METRIC_COLUMNS, MetricColumns
from stethoscope.store.schema import tables
from stethoscope.timeutil import in_range

Refused = tuple[Any, str]  # a row and why no table can take it
# the tables whose node, device and labels a node wrote: names checked (stethoscope.names)
NAMED_TABLES = ("metrics", "bench_results")


@cache
def _columns() -> dict[str, dict[str, str]]:
    """table -> column -> its ClickHouse type, without MATERIALIZED columns (never inserted)."""
    found: dict[str, dict[str, str]] = {}
    for table in tables():
        found[table.name] = {
            name: kind
            for name, _, kind in (column.partition(" ") for column in table.columns)
            if "MATERIALIZED" not in kind
        }
    return found


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _value_problem(name: str, kind: str, value: Any) -> str | None:
    """`<column>: <what is wrong> (<the value>)`: the part before " (" names the kind of fault."""
    if kind.startswith("Nullable("):
        return None if value is None else _value_problem(name, kind[len("Nullable(") : -1], value)
    if kind.startswith("DateTime64"):
        return None if in_range(value) else f"{name}: not a time the store can hold ({_shown(value)})"
    if kind.startswith("Float"):
        if not _is_number(value):
            return f"{name}: not a number ({_shown(value)})"
        return None if _finite(value) else f"{name}: not finite ({_shown(value)})"
    if kind.startswith(("UInt", "Int")):
        bits = int("".join(c for c in kind if c.isdigit()) or 64)
        low, high = (0, 2**bits - 1) if kind.startswith("U") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
        return None if ok else f"{name}: not an integer {low}..{high} ({_shown(value)})"
    if kind.startswith("Map("):
        ok = isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
        return None if ok else f"{name}: not a map of text to text ({_shown(value)})"
    if kind.startswith("Array("):
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
        return None if ok else f"{name}: not a list of text ({_shown(value)})"
    return None if isinstance(value, str) else f"{name}: not text ({_shown(value)})"


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer past any float
        return False


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problem(table: str, row: Any) -> str | None:
    """Why `row` cannot go into `table`, or None when it can."""
    columns = _columns().get(table)
    if columns is None:
        return f"unknown table {table!r}"
    if not isinstance(row, dict):
        return f"not a row ({_shown(row)})"
    for name, kind in columns.items():
        if name not in row:
            return f"missing column {name!r}"
        found = _value_problem(name, kind, row[name])
        if found:
            return found
    if table in NAMED_TABLES:
        if not is_metric_name(row["metric_name"]):
            return "metric_name not a metric name"
        return name_problem(row["node_id"], row["device"], row["labels"])
    return None


def split(table: str, rows: Iterable[Any]) -> tuple[list[dict[str, Any]], list[Refused]]:
    """The rows `table` can take, and the others with their reasons."""
    good: list[dict[str, Any]] = []
    refused: list[Refused] = []
    for row in rows:
        reason = problem(table, row)
        if reason is None:
            good.append(row)
        else:
            refused.append((row, reason))
    return good, refused


def _names_fine(metrics: MetricColumns) -> bool:
    """Each distinct node, device and labels checked once: a stream's rows share a few of each."""
    try:
        nodes, devices, names = set(metrics.node_id), set(metrics.device), set(metrics.metric_name)
        labels = {tuple(each.items()): each for each in _distinct_objects(metrics.labels)}.values()
    except (TypeError, AttributeError):  # a name or labels of no such type: the row by row check says
        return False
    return (
        all(map(is_node_name, nodes))
        and all(map(is_device_name, devices))
        and all(map(is_metric_name, names))
        and all(name_problem("n", "", each) is None for each in labels)
    )


def _distinct_objects(items: list[Any]) -> list[Any]:
    """`items` less each repeat of the one before it: a part's rows share one labels object."""
    kept, last = [], None
    for item in items:
        if item is not last:
            kept.append(item)
            last = item
    return kept


def split_metrics(metrics: MetricColumns) -> tuple[MetricColumns, list[Refused]]:
    """`split` for metric columns, cheap when all is well (the stream writes tens of thousands of rows a
    second): the values and times are checked column by column, rows only when one fails."""
    try:
        fine = all(map(math.isfinite, metrics.value)) and all(map(in_range, metrics.timestamp))
    except (TypeError, OverflowError):  # a value that is no number at all, or past any float
        fine = False
    if fine and _names_fine(metrics):
        return metrics, []
    good, refused = split("metrics", metrics.rows())
    kept = MetricColumns()
    for row in good:
        kept.append(*(row[name] for name in METRIC_COLUMNS))
    return kept, refused
