# Copyright: stethoscope developers
# Apache License 2.0
"""The one exception every parser raises on output it does not understand."""

from __future__ import annotations


class ParseError(ValueError):
    """Unexpected tool output: names the tool, what was wrong and the first bad line."""

    def __init__(self, tool, message, line_no=None, line=None):
        self.tool = tool
        self.message = message
        self.line_no = line_no
        self.line = line
        super().__init__(str(self))

    def __str__(self):
        text = "%s: %s" % (self.tool, self.message)
        if self.line_no is not None:
            text += " at line %d" % self.line_no
        if self.line is not None:
            text += ": %r" % self.line[:200]
        return text


def first_nonblank(text):
    """(line number, line) of the first non-blank line, for errors about a whole output."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            return number, line
    return 1, ""


def to_number(tool, raw, line_no=None):
    """'16x', '35 C', '121.28 W', '0 %' -> float; 'N/A' and friends -> None."""
    if raw is None:
        return None
    text = raw.strip()
    if not text or text in (
        "N/A",
        "[N/A]",
        "Not Supported",
        "[Not Supported]",
        "Unknown",
        "-",
        "Requested functionality has been deprecated",
    ):
        return None
    token = text.split()[0].rstrip("x%")
    try:
        return float(token)
    except ValueError:
        raise ParseError(tool, "expected a number, got %r" % text, line_no, raw) from None


def load_json(tool, text):
    """json.loads with the failure as a ParseError naming the line."""
    import json

    try:
        return json.loads(text)
    except ValueError as exc:
        lines = (text or "").splitlines()
        line_no = getattr(exc, "lineno", 1) or 1
        line = lines[line_no - 1] if 0 < line_no <= len(lines) else ""
        raise ParseError(tool, "not JSON (%s)" % getattr(exc, "msg", exc), line_no, line) from None


def expect(tool, value, kind, what):
    """value if it is of `kind`, else a ParseError saying what was expected (wrong JSON shape)."""
    if not isinstance(value, kind):
        raise ParseError(tool, "%s: expected %s, got %s" % (what, kind.__name__, type(value).__name__))
    return value
