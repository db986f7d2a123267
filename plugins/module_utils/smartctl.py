# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for `smartctl -j -a` (ATA and NVMe)."""

from __future__ import annotations

import os
import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    expect,
    first_nonblank,
    load_json,
)

TOOL = "smartctl -j"
# smartctl's exit status is a bitmask: bits 0-1 mean it could not read the device at all.
EXIT_CANNOT_READ = 0x3
_FIRST_NUMBER = re.compile(r"-?\d+")


def _raw_value(attribute):
    """The raw value as smartctl decodes it: the first number of its raw string (temperatures pack
    current/min/max into the 48-bit raw), else the plain raw value."""
    raw = attribute.get("raw") or {}
    if not isinstance(raw, dict):
        raise ParseError(TOOL, "attribute %r: raw is not an object" % attribute.get("name"))
    match = _FIRST_NUMBER.search(str(raw.get("string", "")))
    if match:
        return int(match.group(0))
    value = raw.get("value")
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_smartctl_json(text):
    data = load_json(TOOL, text)
    if not isinstance(data, dict) or "smartctl" not in data:
        line_no, line = first_nonblank(text)
        raise ParseError(TOOL, "no 'smartctl' section: not smartctl JSON output", line_no, line)
    header = expect(TOOL, data["smartctl"], dict, "smartctl")
    device = expect(TOOL, data.get("device") or {}, dict, "device")
    messages = [
        m.get("string", "")
        for m in expect(TOOL, header.get("messages") or [], list, "messages")
        if isinstance(m, dict)
    ]
    name = os.path.basename(str(device.get("name", ""))) or None
    health = expect(TOOL, data.get("smart_status") or {}, dict, "smart_status").get("passed")
    table = expect(
        TOOL,
        expect(TOOL, data.get("ata_smart_attributes") or {}, dict, "ata_smart_attributes").get("table") or [],
        list,
        "ata_smart_attributes.table",
    )
    attributes = []
    for attribute in table:
        attribute = expect(TOOL, attribute, dict, "ATA attribute")
        if not isinstance(attribute.get("name"), str):
            raise ParseError(TOOL, "ATA attribute %r without a name" % attribute.get("id"))
        attributes.append(
            {
                "id": attribute.get("id"),
                "name": attribute["name"],
                "raw": _raw_value(attribute),
                "normalized": _number(attribute.get("value")),
                "worst": _number(attribute.get("worst")),
                "thresh": _number(attribute.get("thresh")),
                "when_failed": attribute.get("when_failed", ""),
            }
        )
    nvme = data.get("nvme_smart_health_information_log")
    if nvme is not None:
        nvme = {
            k: _number(v) for k, v in expect(TOOL, nvme, dict, "nvme_smart_health_information_log").items()
        }
    return {
        "device": name,
        "protocol": device.get("protocol"),
        "model": data.get("model_name"),
        "serial": data.get("serial_number"),
        "firmware": data.get("firmware_version"),
        "exit_status": _number(header.get("exit_status")) or 0,
        "messages": messages,
        "health_passed": None if health is None else bool(health),
        "temperature_celsius": _number(
            expect(TOOL, data.get("temperature") or {}, dict, "temperature").get("current")
        ),
        "ata_attributes": attributes,
        "nvme_health": nvme,
    }


def smart_metrics(disk):
    rows, dev = [], disk["device"]
    add(
        rows,
        "smart_health_passed",
        dev,
        None if disk["health_passed"] is None else int(disk["health_passed"]),
    )
    add(rows, "smart_exit_status", dev, disk["exit_status"])
    add(rows, "disk_temperature_celsius", dev, disk["temperature_celsius"])
    names = [attribute["name"].lower() for attribute in disk["ata_attributes"]]
    for attribute in disk["ata_attributes"]:
        base = "smart_" + attribute["name"].lower()
        # Some firmware reports two attributes under one name (the Intel S4500 does, with ids 170/232):
        # the id then keeps them apart instead of one silently replacing the other.
        labels = (
            {"attribute_id": str(attribute["id"])} if names.count(attribute["name"].lower()) > 1 else None
        )
        add(rows, base, dev, attribute["raw"], labels)
        add(rows, base + "_normalized", dev, attribute["normalized"], labels)
    nvme = disk["nvme_health"]
    if nvme:
        add(rows, "nvme_percentage_used", dev, nvme.get("percentage_used"))
        add(rows, "nvme_media_errors_total", dev, nvme.get("media_errors"))
        add(rows, "nvme_critical_warning", dev, nvme.get("critical_warning"))
        add(rows, "nvme_available_spare_percent", dev, nvme.get("available_spare"))
    return rows
