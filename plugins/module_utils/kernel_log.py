# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parsers for NVIDIA events in kernel log text (dmesg, dmesg -T, journalctl -k, /dev/kmsg records):
XIDs, a GPU lost without an Xid line (fallen off the bus, adapter init failed) and NVSwitch SXids."""

from __future__ import annotations

import re

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+)(?:, (.*))?")
_MONOTONIC = re.compile(r"^\[\s*(\d+\.\d+)\]")
_BDF = r"([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
# The runtime form (`NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.`) and the old one
# (`NVRM: GPU at 0000:01:00.0 has fallen off the bus.`); the Xid 79 line is never one of them.
_FALLEN_OFF = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?" + _BDF + r":? (?:GPU )?has fallen off the bus")
# At driver load the message spans up to three lines: `NVRM: The NVIDIA GPU 0000:b3:00.0` /
# `NVRM: (PCI ID: ...) installed in this system has` / `NVRM: fallen off the bus and is not responding`.
_PROBE_GPU = re.compile(r"NVRM: The NVIDIA GPU " + _BDF)
_PROBE_LINES = 3
_INIT_FAILED = re.compile(r"NVRM: GPU " + _BDF + r": RmInitAdapter failed")
_SXID = re.compile(r"nvidia-nvswitch(\d+): SXid \(PCI:" + _BDF + r"\): (\d+), (.*)")
_SXID_SEVERITY = {"Fatal": "fatal", "Non-fatal": "nonfatal"}
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


def parse_gpu_lost_events(text):
    """GPUs the driver lost, from NVRM lines without an Xid prefix, in order:
    [{"monotonic", "bdf", "reason": "fallen_off_bus" | "init_failed", "line"}].

    The Xid 79 line of the same incident is not one of these: it is counted as an XID.
    """
    lines = text.splitlines()
    events = []
    for index, line in enumerate(lines):
        reason, match = _gpu_lost_match(line, lines[index : index + _PROBE_LINES])
        if match:
            events.append(
                {
                    "monotonic": _monotonic(line),
                    "bdf": normalize_bdf(match.group(1)),
                    "reason": reason,
                    "line": line.strip(),
                }
            )
    return events


def _gpu_lost_match(line, window):
    match = _FALLEN_OFF.search(line)
    if match:
        return "fallen_off_bus", match
    match = _PROBE_GPU.search(line)
    if match and any("fallen off the bus" in later for later in window):
        return "fallen_off_bus", match
    match = _INIT_FAILED.search(line)
    if match:
        return "init_failed", match
    return None, None


def parse_sxid_events(text):
    """NVSwitch SXid events, in order: [{"monotonic", "switch": "nvswitchN", "bdf", "sxid",
    "severity": "fatal" | "nonfatal" | "unknown", "line"}].

    The driver prints one event as a headline (`<sxid>, Fatal|Non-fatal, Link N ...`) followed by
    `Severity ...` and `Data {...}` lines of the same switch and SXid: those belong to the open event.
    A detail line with no headline before it (a log that starts mid-event) is an event of unknown
    severity, so it is neither lost nor counted twice.
    """
    events, open_events = [], set()
    for line in text.splitlines():
        match = _SXID.search(line)
        if not match:
            continue
        switch, sxid = "nvswitch" + match.group(1), int(match.group(3))
        headline = match.group(4).split(",", 1)[0].strip()
        key = (switch, sxid)
        if headline not in _SXID_SEVERITY and key in open_events:
            continue
        open_events.add(key)
        events.append(
            {
                "monotonic": _monotonic(line),
                "switch": switch,
                "bdf": match.group(2).lower(),
                "sxid": sxid,
                "severity": _SXID_SEVERITY.get(headline, "unknown"),
                "line": line.strip(),
            }
        )
    return events
