# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parser for `smartctl -j -a` (ATA, SCSI/SAS and NVMe)."""

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
# `-d megaraid,N` or `-d sat+megaraid,N`: a physical disk N behind a MegaRAID controller
_MEGARAID_TYPE = re.compile(r"^(?:sat\+)?(megaraid,\d+)$")
# smartctl's per-attribute WHEN_FAILED, as the metric smart_attribute_failing reports it
WHEN_FAILED = {"": 0, "past": 1, "now": 2}
SCSI_ERROR_LOGS = ("read", "write", "verify")


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
    slot = _megaraid_slot(device)
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
                "when_failed": _when_failed(attribute),
            }
        )
    nvme = data.get("nvme_smart_health_information_log")
    if nvme is not None:
        nvme = {
            k: _number(v) for k, v in expect(TOOL, nvme, dict, "nvme_smart_health_information_log").items()
        }
    return {
        "device": _device_name(device, slot),
        "slot": slot,
        "protocol": device.get("protocol"),
        # a SCSI disk's vendor and product: scsi_model_name in newer smartctl (7.4), model_name in older (7.1)
        "model": data.get("model_name") or data.get("scsi_model_name"),
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
        "scsi_health": _scsi_health(data),
    }


def parse_scan_raid(text):
    """The disks behind a RAID controller in `smartctl --scan` (`/dev/bus/0 -d megaraid,3 # ...`), as
    `PATH -d TYPE` entries (the other lines are block devices /sys/block lists anyway), and a ParseError
    for each line of another shape: one odd line never hides the others."""
    entries, refused = [], []
    for line_no, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 3 or words[1] != "-d":
            refused.append(ParseError("smartctl --scan", "not 'PATH -d TYPE # comment'", line_no, line))
        elif _MEGARAID_TYPE.match(words[2]) and " ".join(words) not in entries:
            entries.append(" ".join(words))
    return entries, refused


def device_name(path, device_type=""):
    """What the rows call a disk smartctl is asked about: `sda` for `/dev/sda`, `bus0:megaraid,3` for
    `/dev/bus/0` with `-d megaraid,3`."""
    device = {"name": path, "type": device_type}
    return _device_name(device, _megaraid_slot(device))


def _megaraid_slot(device):
    match = _MEGARAID_TYPE.match(str(device.get("type", "")))
    return match.group(1) if match else None


def _device_name(device, slot):
    """The block device (`sda`, `nvme0n1`); a disk behind MegaRAID is its controller and slot
    (`bus0:megaraid,3` for `/dev/bus/0 -d megaraid,3`): the path alone names the controller."""
    path = str(device.get("name", ""))
    if slot:
        return "%s:%s" % (path.replace("/dev/", "", 1).replace("/", ""), slot)
    return os.path.basename(path) or None


def _when_failed(attribute):
    when = attribute.get("when_failed", "")
    if not isinstance(when, str) or when.lower() not in WHEN_FAILED:
        raise ParseError(
            TOOL, "attribute %r: when_failed %r is not now, past or empty" % (attribute["name"], when)
        )
    return when.lower()


def _scsi_health(data):
    """A SCSI (SAS) disk's grown defect list and uncorrected errors per error counter log (read,
    write, verify: the logs the drive keeps); None for ATA and NVMe."""
    logs = expect(TOOL, data.get("scsi_error_counter_log") or {}, dict, "scsi_error_counter_log")
    defects = _number(data.get("scsi_grown_defect_list"))
    if not logs and defects is None:
        return None
    uncorrected = {}
    for operation in SCSI_ERROR_LOGS:
        if operation in logs:
            log = expect(TOOL, logs[operation], dict, "scsi_error_counter_log." + operation)
            uncorrected[operation] = _number(log.get("total_uncorrected_errors"))
    return {"grown_defects": defects, "uncorrected_errors": uncorrected}


def smart_metrics(disk):
    rows, dev = [], disk["device"]
    # behind a RAID controller the slot names the disk: its serial tells a swapped disk from the old one
    disk_labels = {"serial": str(disk["serial"])} if disk.get("slot") and disk.get("serial") else {}
    add(
        rows,
        "smart_health_passed",
        dev,
        None if disk["health_passed"] is None else int(disk["health_passed"]),
        disk_labels,
    )
    add(rows, "smart_exit_status", dev, disk["exit_status"], disk_labels)
    add(rows, "disk_temperature_celsius", dev, disk["temperature_celsius"], disk_labels)
    rows += _ata_rows(disk["ata_attributes"], dev, disk_labels)
    nvme = disk["nvme_health"]
    if nvme:
        add(rows, "nvme_percentage_used", dev, nvme.get("percentage_used"), disk_labels)
        add(rows, "nvme_media_errors_total", dev, nvme.get("media_errors"), disk_labels)
        add(rows, "nvme_critical_warning", dev, nvme.get("critical_warning"), disk_labels)
        add(rows, "nvme_available_spare_percent", dev, nvme.get("available_spare"), disk_labels)
    scsi = disk.get("scsi_health")
    if scsi:
        add(rows, "disk_grown_defects_total", dev, scsi["grown_defects"], disk_labels)
        for operation, count in sorted(scsi["uncorrected_errors"].items()):
            add(rows, "disk_uncorrected_errors_total", dev, count, dict(disk_labels, operation=operation))
    return rows


def _ata_rows(attributes, dev, disk_labels):
    rows = []
    names = [attribute["name"].lower() for attribute in attributes]
    for attribute in attributes:
        name = attribute["name"].lower()
        # Some firmware reports two attributes under one name (the Intel S4500 does, with ids 170/232):
        # the id then keeps them apart instead of one silently replacing the other.
        labels = (
            dict(disk_labels, attribute_id=str(attribute["id"])) if names.count(name) > 1 else disk_labels
        )
        base = "smart_" + name
        add(rows, base, dev, attribute["raw"], labels)
        add(rows, base + "_normalized", dev, attribute["normalized"], labels)
        # a threshold of 0 means the attribute can never fail: no row for it
        if attribute["thresh"] != 0 or attribute["when_failed"]:
            failing = WHEN_FAILED[attribute["when_failed"]]
            add(rows, "smart_attribute_failing", dev, failing, dict(labels, attribute=name))
    return rows
