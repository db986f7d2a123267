# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parsers for PCIe AER sysfs files, link attributes and `lspci -vvv` status bits."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

AER_FILES = {
    "aer_dev_correctable": ("TOTAL_ERR_COR", "pcie_aer_correctable_errors_total"),
    "aer_dev_nonfatal": ("TOTAL_ERR_NONFATAL", "pcie_aer_nonfatal_errors_total"),
    "aer_dev_fatal": ("TOTAL_ERR_FATAL", "pcie_aer_fatal_errors_total"),
}


def parse_aer_file(name, text):
    """'RxErr 0\\nBadTLP 0\\n...\\nTOTAL_ERR_COR 0' -> {"RxErr": 0, ..., "TOTAL_ERR_COR": 0}."""
    tool = "sysfs %s" % name
    counts = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2:
            raise ParseError(tool, "expected '<name> <count>'", number, line)
        try:
            counts[fields[0]] = int(fields[1])
        except ValueError:
            raise ParseError(tool, "count %r is not an integer" % fields[1], number, line) from None
    if not counts:
        raise ParseError(tool, "empty file", 1, "")
    return counts


def aer_total(name, counts):
    """The kernel's own total where it writes one (5.x+); else the sum of the fields."""
    total_key = AER_FILES[name][0]
    if total_key in counts:
        return counts[total_key]
    return sum(counts.values())


def parse_link_speed(text):
    """'32.0 GT/s PCIe' / '16 GT/s' / 'Unknown' -> GT/s as float, or None."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


def parse_link_width(text):
    text = (text or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def link_degraded(width, max_width, speed, max_speed, busy):
    """docs/design.md: width below max always counts; speed below max only while busy (GPUs idle down)."""
    if width is not None and max_width is not None and width < max_width:
        return 1
    if busy and speed is not None and max_speed is not None and speed < max_speed:
        return 1
    if width is None and speed is None:
        return None
    return 0


# The domain is 4 hex digits, or more behind an Intel VMD (`10000:e0:06.0`); `lspci` without -D omits it.
_STANZA = re.compile(r"^([0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7] ")
_FLAGS = re.compile(r"(\w+)([+-])")


def parse_lspci_vvv(text):
    """`lspci -vvv` -> [{"bdf", "description", "uesta": [set bits], "cesta": [...], "lnk_*"}]."""
    tool = "lspci -vvv"
    devices, current = [], None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if _STANZA.match(line):
            bdf, _space, description = line.partition(" ")
            if bdf.count(":") == 1:
                bdf = "0000:" + bdf
            current = {
                "bdf": bdf,
                "description": description,
                "uesta": None,
                "cesta": None,
                "lnk_cap_speed": None,
                "lnk_cap_width": None,
                "lnk_sta_speed": None,
                "lnk_sta_width": None,
            }
            devices.append(current)
            continue
        if current is None:
            raise ParseError(tool, "expected a device line '<bus>:<dev>.<fn> <description>'", number, line)
        stripped = line.strip()
        key, _colon, rest = stripped.partition(":")
        if key in ("UESta", "CESta"):
            current[key.lower()] = [flag for flag, sign in _FLAGS.findall(rest) if sign == "+"]
        elif key in ("LnkCap", "LnkSta"):
            speed = re.search(r"Speed (\d+(?:\.\d+)?)GT/s", rest)
            width = re.search(r"Width x(\d+)", rest)
            prefix = "lnk_cap" if key == "LnkCap" else "lnk_sta"
            current[prefix + "_speed"] = float(speed.group(1)) if speed else None
            current[prefix + "_width"] = int(width.group(1)) if width else None
    return devices
