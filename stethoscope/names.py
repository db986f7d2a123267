"""The one node-name validator: a name reaches a command (ansible `--limit`, `scontrol`, a verify
query) only if it is an inventory host and matches NODE_NAME. plugins/modules/slurm_node.py, which
cannot import the controller, carries the same pattern (a test checks they agree)."""

from __future__ import annotations

import re

# a hostname as Slurm, ansible's --limit and a shell accept it: no leading '-' (an option), no
# separators, globs or spaces; up to a full DNS name's 253 characters
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def is_node_name(name: object) -> bool:
    return isinstance(name, str) and NODE_NAME.fullmatch(name) is not None
