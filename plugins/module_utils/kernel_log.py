# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for NVIDIA XID events in kernel log text (dmesg, dmesg -T, /dev/kmsg records)."""

from __future__ import annotations

import re

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)(?:, (.*))?")
_MONOTONIC = re.compile(r"^\[\s*(\d+\.\d+)\]")
_KMSG = re.compile(r"^\d+,\d+,(\d+),[^;]*;")


def _monotonic(line):
    match = _MONOTONIC.match(line)
    if match:
        return float(match.group(1))
    match = _KMSG.match(line)
    if match:
        return int(match.group(1)) / 1e6
    return None


def normalize_bdf(text):
    """'PCI:0000:00:06' / '000d:00:00' / '00000000:00:06.0' -> 'dddd:bb:dd' (lower case, no function)."""
    parts = text.lower().replace("pci:", "").split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    domain, bus, device = parts[-3], parts[-2], parts[-1].split(".")[0]
    return "%04x:%02x:%02x" % (int(domain, 16), int(bus, 16), int(device, 16))


def parse_xid_events(text):
    """Every XID line: [{"monotonic": seconds or None, "bdf", "xid", "detail", "line"}], in order.

    Lines that are not XID events are not errors: a kernel log is mostly other things.
    """
    events = []
    for line in text.splitlines():
        match = _XID.search(line)
        if not match:
            continue
        events.append(
            {
                "monotonic": _monotonic(line),
                "bdf": normalize_bdf(match.group(1)),
                "xid": int(match.group(2)),
                "detail": (match.group(3) or "").strip(),
                "line": line.strip(),
            }
        )
    return events
