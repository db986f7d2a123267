# -*- coding: utf-8 -*-
# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for `smartctl -j -a` (ATA and NVMe)."""

from __future__ import annotations

import json
import os
import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError, first_nonblank

TOOL = "smartctl -j"
# smartctl's exit status is a bitmask: bits 0-1 mean it could not read the device at all.
EXIT_CANNOT_READ = 0x3
_FIRST_NUMBER = re.compile(r"-?\d+")


def _raw_value(attribute):
    """The raw value as smartctl decodes it: the first number of its raw string (temperatures pack
    current/min/max into the 48-bit raw), else the plain raw value."""
    raw = attribute.get("raw") or {}
    match = _FIRST_NUMBER.search(str(raw.get("string", "")))
    if match:
        return int(match.group(0))
    value = raw.get("value")
    return value if isinstance(value, (int, float)) else None


def parse_smartctl_json(text):
    try:
        data = json.loads(text)
    except ValueError as exc:
        lines = text.splitlines()
        line_no = getattr(exc, "lineno", 1)
        raise ParseError(TOOL, "not JSON (%s)" % getattr(exc, "msg", exc), line_no,
                         lines[line_no - 1] if 0 < line_no <= len(lines) else "")
    if not isinstance(data, dict) or "smartctl" not in data:
        line_no, line = first_nonblank(text)
        raise ParseError(TOOL, "no 'smartctl' section: not smartctl JSON output", line_no, line)
    device = data.get("device") or {}
    exit_status = (data.get("smartctl") or {}).get("exit_status", 0)
    messages = [m.get("string", "") for m in (data.get("smartctl") or {}).get("messages", []) or []]
    name = os.path.basename(device.get("name", "")) or None
    health = (data.get("smart_status") or {}).get("passed")
    attributes = []
    for attribute in (data.get("ata_smart_attributes") or {}).get("table", []) or []:
        if "name" not in attribute:
            raise ParseError(TOOL, "ATA attribute without a name: %r" % attribute.get("id"), None, None)
        attributes.append({
            "id": attribute.get("id"),
            "name": attribute["name"],
            "raw": _raw_value(attribute),
            "normalized": attribute.get("value"),
            "worst": attribute.get("worst"),
            "thresh": attribute.get("thresh"),
            "when_failed": attribute.get("when_failed", ""),
        })
    nvme = data.get("nvme_smart_health_information_log")
    return {
        "device": name,
        "protocol": device.get("protocol"),
        "model": data.get("model_name"),
        "serial": data.get("serial_number"),
        "firmware": data.get("firmware_version"),
        "exit_status": exit_status,
        "messages": messages,
        "health_passed": None if health is None else bool(health),
        "temperature_celsius": (data.get("temperature") or {}).get("current"),
        "ata_attributes": attributes,
        "nvme_health": nvme,
    }


def smart_metrics(disk):
    rows, dev = [], disk["device"]
    add(rows, "smart_health_passed", dev, None if disk["health_passed"] is None else int(disk["health_passed"]))
    add(rows, "smart_exit_status", dev, disk["exit_status"])
    add(rows, "disk_temperature_celsius", dev, disk["temperature_celsius"])
    for attribute in disk["ata_attributes"]:
        base = "smart_" + attribute["name"].lower()
        add(rows, base, dev, attribute["raw"])
        add(rows, base + "_normalized", dev, attribute["normalized"])
    nvme = disk["nvme_health"]
    if nvme:
        add(rows, "nvme_percentage_used", dev, nvme.get("percentage_used"))
        add(rows, "nvme_media_errors_total", dev, nvme.get("media_errors"))
        add(rows, "nvme_critical_warning", dev, nvme.get("critical_warning"))
        add(rows, "nvme_available_spare_percent", dev, nvme.get("available_spare"))
    return rows
