# Copyright: stethoscope developers
# Apache License 2.0
"""`scontrol -o show node NAME`: one line of Key=Value pairs; Reason is the last key and keeps its
spaces ("Reason=stethoscope: rule txn [root@2026-11-30T02:30:25]")."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
)

TOOL = "scontrol -o show node"
# the drain flags: a node drained (no new jobs) whether or not its jobs have finished
DRAIN_FLAGS = ("DRAIN", "DRAINING", "DRAINED")
_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")


def parse_show_node(text):
    """-> {name, state, flags, drained, reason}; ParseError on anything but one node line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("NodeName="):
        number, line = first_nonblank(text)
        raise ParseError(TOOL, "expected one line starting with NodeName=", number, line)
    line = lines[0]
    head, _sep, reason = line.partition(" Reason=")
    fields = {}
    for token in head.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    if "State" not in fields:
        raise ParseError(TOOL, "no State= field", 1, line)
    parts = fields["State"].split("+")
    flags = [p.upper() for p in parts[1:]]
    return {
        "name": fields["NodeName"],
        "state": parts[0].upper(),
        "flags": flags,
        "drained": any(flag in DRAIN_FLAGS for flag in flags) or parts[0].upper() in DRAIN_FLAGS,
        "reason": _STAMP.sub("", reason).strip(),
    }
