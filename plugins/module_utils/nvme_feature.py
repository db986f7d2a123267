# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for `nvme get-feature <dev> --feature-id=0x06` (volatile write cache)."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
)

TOOL = "nvme get-feature"
_VALUE = re.compile(r"Current value:\s*(0x[0-9a-fA-F]+|\d+)")


def parse_get_feature(text):
    """'get-feature:0x06 (Volatile Write Cache), Current value:0x00000001' -> 1."""
    match = _VALUE.search(text or "")
    if not match:
        line_no, line = first_nonblank(text or "")
        raise ParseError(TOOL, "no 'Current value:' in output", line_no, line)
    return int(match.group(1), 0)
