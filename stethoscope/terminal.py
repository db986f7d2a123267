"""Text from nodes, safe to print for a person: node names, devices, labels and messages reach the
terminal only with their control characters (C0 with newline and tab, DEL, C1: an escape sequence
can clear the screen, retitle the window or forge lines) and the Unicode controls that reorder or
hide text (bidi overrides and isolates, line separators) shown as visible escapes. JSON output needs
none of this: it escapes them itself."""

from __future__ import annotations

import os
from typing import Any, TextIO

_CONTROLS = [*range(0x00, 0x20), *range(0x7F, 0xA0)]
# bidi marks, overrides and isolates; zero-width characters, the word joiner and the BOM, which hide
# text or split a name that looks whole
_BIDI = [0x061C, *range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2060, 0x206A), 0xFEFF]
_SEPARATORS = [0x2028, 0x2029]  # line and paragraph separators: a newline to some terminals
_VISIBLE = {
    **{code: f"\\x{code:02x}" for code in _CONTROLS},
    **{code: f"\\u{code:04x}" for code in _BIDI + _SEPARATORS},
}


def terminal_safe(text: object) -> str:
    """`text` as one line a terminal shows as written: `\\x1b[2J` prints as those six characters."""
    return str(text).translate(_VISIBLE)


def terminal_safe_data(value: Any) -> Any:
    """`value` with every string in it (in dicts, lists and tuples, keys included) made terminal-safe:
    for records a renderer of someone else's formats field by field."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, dict):
        return {terminal_safe_data(k): terminal_safe_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [terminal_safe_data(item) for item in value]
    if isinstance(value, tuple):
        return tuple(terminal_safe_data(item) for item in value)
    return value


def aligned(rows: list[list[str]], gap: str = "  ") -> list[str]:
    """Rows of cells (headers first, where a table has them) as lines whose columns line up, each as
    wide as its widest cell (the last column unpadded): a long device or creator never shifts the
    rest. Each cell is made terminal-safe first."""
    safe = [[terminal_safe(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in safe if i < len(row)) for i in range(max(map(len, safe), default=0))]
    return [
        gap.join(cell if i == len(row) - 1 else cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip()
        for row in safe
    ]


def colour_wanted(stream: TextIO) -> bool:
    """ANSI colour only on a terminal, and never where NO_COLOR is set to anything (https://no-color.org)."""
    return not os.environ.get("NO_COLOR") and stream.isatty()
