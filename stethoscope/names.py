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


# A device as the collectors name one: `gpu3`, `gpu3/link2`, `mlx5_0/1`, `0000:17:00.0`, `nvme0n1`,
# `megaraid,0`, `switch:leaf3`; '' for the node itself. Segments begin with a letter or digit (no
# `..`, no leading '/' or '-'), and nothing a template, a shell or a terminal reads as syntax.
DEVICE_NAME = re.compile(
    r"^(?:[A-Za-z0-9][A-Za-z0-9._:,@+=-]{0,63})(?:/[A-Za-z0-9][A-Za-z0-9._:,@+=-]{0,63}){0,3}$"
)
# Label names as Prometheus has them; values free text but for template braces, control characters
# and the Unicode controls that reorder or hide what a terminal shows.
LABEL_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
LABEL_VALUE = re.compile(r"^[^{}\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]*$")


# a metric's name: the catalog's, and what the collectors derive (`smart_power-off_retract_count`)
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,127}$")


def is_metric_name(name: object) -> bool:
    return isinstance(name, str) and METRIC_NAME.fullmatch(name) is not None


def is_device_name(name: object) -> bool:
    return isinstance(name, str) and (name == "" or DEVICE_NAME.fullmatch(name) is not None)


def name_problem(node_id: object, device: object, labels: object) -> str | None:
    """Why a row's node, device or labels may not be stored (they reach templates, commands and
    terminals), or None. The reason never quotes the name: it is counted by reason, and the row is
    kept beside it (the spool's rejected/ folder, or the line's number)."""
    if not is_node_name(node_id):
        return "node_id not a host name"
    if not is_device_name(device):
        return "device not a device name"
    if isinstance(labels, dict):
        for key, value in labels.items():
            if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
                return "label name not a label name"
            if isinstance(value, str) and not LABEL_VALUE.fullmatch(value):
                return "label value with braces or control characters"
    return None
