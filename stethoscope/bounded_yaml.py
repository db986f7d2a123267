"""YAML from operators' files, bounded: a file over its size limit is refused unread, and a document
is refused while it is composed, before anything is built from it, when it holds too many aliases,
nests too deep, or would expand past a node count (a "billion laughs": nine aliases nine levels deep
are 387 million strings). Each refusal is a YAML error with the file and line, so every reader reports
it as it reports a syntax error."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

MIB = 1024 * 1024
RULE_FILE_MAX_BYTES = 4 * MIB  # a rule file, the metric catalog, a faults file
INVENTORY_FILE_MAX_BYTES = 16 * MIB  # an inventory file, or one of its group_vars or host_vars
YAML_MAX_ALIASES = 10_000  # alias uses (*name) in one file
YAML_MAX_NODES = 1_000_000  # nodes of one document with every alias expanded
YAML_MAX_DEPTH = 100  # nesting, aliases expanded (deeper would exhaust Python's stack)


class YamlTooLarge(yaml.MarkedYAMLError):
    """A YAML file or document past one of the bounds above."""

    def __init__(self, problem: str, mark: yaml.Mark) -> None:
        super().__init__(problem=problem, problem_mark=mark)
        self.file, self.line = mark.name, mark.line + 1

    def where(self) -> str:
        """`file:line: problem`, on one line."""
        return f"{self.file}:{self.line}: {self.problem}"


class BoundedSafeLoader(yaml.SafeLoader):
    """A SafeLoader that refuses, while composing, what YAML_MAX_ALIASES, YAML_MAX_DEPTH and
    YAML_MAX_NODES bound."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > YAML_MAX_ALIASES:
                raise YamlTooLarge(f"more than {YAML_MAX_ALIASES} aliases", self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > YAML_MAX_DEPTH:
                raise YamlTooLarge(
                    f"nested deeper than {YAML_MAX_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> yaml.Node | None:
        document = super().compose_document()
        if document is not None:
            _Expansion().measure(document, 1)
        return document


class _Expansion:
    """The size of a composed document with its aliases expanded. An alias is the anchored node
    itself, so each node is measured once and its size reused wherever an alias names it."""

    def __init__(self) -> None:
        self.measured: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, height)
        self.open: set[int] = set()

    def measure(self, node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        if key in self.open:
            raise YamlTooLarge("an alias inside the node it names (a recursive alias)", node.start_mark)
        nodes, height = self.measured.get(key) or self._measure_new(node, depth)
        if depth + height > YAML_MAX_DEPTH:
            raise YamlTooLarge(
                f"nested deeper than {YAML_MAX_DEPTH} levels once its aliases expand", node.start_mark
            )
        return nodes, height

    def _measure_new(self, node: yaml.Node, depth: int) -> tuple[int, int]:
        key = id(node)
        self.open.add(key)
        nodes, height = 1, 0
        for child in _children(node):
            child_nodes, child_height = self.measure(child, depth + 1)
            nodes += child_nodes
            height = max(height, child_height + 1)
            if nodes > YAML_MAX_NODES:
                raise YamlTooLarge(f"its aliases expand past {YAML_MAX_NODES} nodes", node.start_mark)
        self.open.discard(key)
        self.measured[key] = (nodes, height)
        return nodes, height


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def is_stdin(path: Path | str) -> bool:
    """`-`: the command-line convention for standard input in place of a file."""
    return str(path) == "-"


def read_bounded(path: Path, max_bytes: int, kind: str) -> bytes:
    """The bytes of `path` (standard input for `-`), read no further than `max_bytes`: YamlTooLarge when
    there are more."""
    if is_stdin(path):
        data = sys.stdin.buffer.read(max_bytes + 1)
    else:
        with path.open("rb") as file:
            data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        start = yaml.Mark(str(path), 0, 0, 0, None, 0)
        raise YamlTooLarge(f"larger than {max_bytes / MIB:g} MiB, the most a {kind} may be", start)
    return data


def load_bounded(
    path: Path, max_bytes: int, kind: str, loader: type[BoundedSafeLoader] = BoundedSafeLoader
) -> Any:
    """The one document of the YAML (or JSON) file `path`, within the bounds; YAMLError otherwise
    (YamlTooLarge for a bound, the parser's own errors for bad syntax or bad UTF-8)."""
    reader = loader(read_bounded(path, max_bytes, kind))
    reader.name = str(path)  # marks name the file, not "<byte string>"
    try:
        return reader.get_single_data()
    finally:
        reader.dispose()


def check_bounded(path: Path, max_bytes: int, kind: str) -> None:
    """Refuse `path` (YamlTooLarge) when it is past a bound: what it would be composed into is not
    built, and a file that is not YAML at all (an INI inventory) is left to its reader."""
    reader = BoundedSafeLoader(read_bounded(path, max_bytes, kind))
    reader.name = str(path)
    try:
        while reader.check_node():
            reader.get_node()
    except YamlTooLarge:
        raise
    except yaml.YAMLError:
        return
    finally:
        reader.dispose()
