"""A faults file (`stethoscope audit --faults FILE`): YAML, JSON or CSV, one fault per entry with
node, kind, layer, impact and optionally device and note.

`impact` is ISO-8601, epoch seconds, or relative to the newest stored sample (the lab's last sweep):
`latest`, `latest-10m`, `latest-2h`. A bad file is a configuration error: every problem is reported
as file:line and nothing is imported.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stethoscope.bounded_yaml import (
    RULE_FILE_MAX_BYTES,
    BoundedSafeLoader,
    YamlTooLarge,
    is_stdin,
    read_bounded,
)
from stethoscope.catalog import LAYERS
from stethoscope.store.faults import Fault
from stethoscope.timeutil import DurationError, parse_duration, to_ms

FIELDS = {"node", "node_id", "kind", "layer", "impact", "impact_at", "device", "note"}
_RELATIVE = re.compile(r"^latest\s*(?:-\s*(.+))?$")
_CSV_HEADER = re.compile(r"^\s*\w+\s*(,\s*\w+\s*)+$")
_KIND = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class Parsed:
    faults: list[Fault] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class _Lines(BoundedSafeLoader):
    pass


def _mapping(loader: _Lines, node: yaml.MappingNode) -> dict:
    data = loader.construct_mapping(node, deep=True)
    data["__line__"] = node.start_mark.line + 1
    return data


_Lines.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def _is_csv(path: Path, text: str) -> bool:
    """By its suffix; on standard input (no name), by a first line of bare column names."""
    if is_stdin(path):
        first = next((line for line in text.splitlines() if line.strip()), "")
        return bool(_CSV_HEADER.match(first))
    return path.suffix.lower() == ".csv"


def _entries(path: Path, text: str) -> tuple[list[tuple[int, Any]], list[str]]:
    if _is_csv(path, text):
        reader = csv.DictReader(text.splitlines())
        entries: list[tuple[int, Any]] = []
        for row in reader:
            entries.append((reader.line_num, {k.strip(): (v or "").strip() for k, v in row.items() if k}))
        return entries, []
    try:  # JSON is read by the YAML loader too, so that its entries have lines
        data = yaml.load(text, Loader=_Lines)  # _Lines is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        return [], [f"{path}:{line}: not valid YAML/JSON: {getattr(exc, 'problem', exc)}"]
    if isinstance(data, dict) and "faults" in data:
        data = data["faults"]
    if data is None:
        return [], []
    if not isinstance(data, list):
        return [], [f"{path}:1: expected a list of faults (or a mapping with `faults:`)"]
    return [(item.get("__line__", 0) if isinstance(item, dict) else 0, item) for item in data], []


def impact_of(text: Any, latest_ms: int | None) -> int:
    """An impact time in ms; ValueError with the reason when it is not one."""
    match = _RELATIVE.match(str(text).strip())
    if match:
        if latest_ms is None:
            raise ValueError(f"impact {text!r} is relative to the newest sample, and the store has none")
        try:
            ago = parse_duration(match.group(1)) if match.group(1) else 0
        except DurationError:
            raise ValueError(f"impact {text!r}: latest-DURATION, a duration such as 10m or 1.5h") from None
        return latest_ms - round(ago * 1000)
    try:
        return to_ms(text)
    except (ValueError, OverflowError):
        raise ValueError(
            f"impact {text!r} is neither ISO-8601, epoch seconds nor latest[-DURATION]"
        ) from None


def parse(path: Path, known_nodes: set[str], latest_ms: int | None) -> Parsed:
    parsed = Parsed()
    try:
        text = read_bounded(path, RULE_FILE_MAX_BYTES, "faults file").decode("utf-8")
    except YamlTooLarge as exc:
        parsed.errors.append(exc.where())
        return parsed
    except (OSError, UnicodeDecodeError) as exc:
        parsed.errors.append(f"{path}: cannot read: {exc}")
        return parsed
    entries, parsed.errors = _entries(path, text)
    for line, entry in entries:
        where = f"{path}:{line}"
        if not isinstance(entry, dict):
            parsed.errors.append(f"{where}: expected a mapping with node, kind, layer, impact")
            continue
        entry = {k: v for k, v in entry.items() if k != "__line__"}
        problems = [f"unknown field {k!r}" for k in sorted(set(map(str, entry)) - FIELDS)]
        node = str(entry.get("node") or entry.get("node_id") or "")
        kind = str(entry.get("kind") or "")
        layer = str(entry.get("layer") or "")
        if not node:
            problems.append("node is missing")
        elif node not in known_nodes:
            problems.append(f"unknown node {node!r} (not in the nodes table, the metrics or fault_windows)")
        if not _KIND.match(kind):
            problems.append(f"kind {kind!r} must be a name (letters, digits, _ . -)")
        if layer not in LAYERS:
            problems.append(f"unknown layer {layer!r} (one of {', '.join(LAYERS)})")
        impact = entry.get("impact", entry.get("impact_at"))
        impact_ms = 0
        try:
            impact_ms = impact_of("" if impact is None else impact, latest_ms)
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            parsed.errors += [f"{where}: {problem}" for problem in problems]
            continue
        device = str(entry.get("device") or "")
        parsed.faults.append(
            Fault(node, kind, layer, impact_ms, device, "imported", str(entry.get("note") or ""))
        )
    return parsed
