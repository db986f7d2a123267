# Copyright: stethoscope developers
# Apache License 2.0
"""Vital product data as sysfs gives it: a PCI device's VPD (`/sys/bus/pci/devices/<bdf>/vpd`, PCI 3.0
section 6.4) and a SCSI disk's unit serial number page (`/sys/block/sdX/device/vpd_pg80`, SPC-4 7.8.15)."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

PCI_TOOL = "pci vpd"
SCSI_TOOL = "vpd_pg80"

IDENTIFIER_STRING = 0x02  # large resource names (the tag byte less its top bit)
READ_ONLY = 0x10
READ_WRITE = 0x11
LARGE_RESOURCES = (IDENTIFIER_STRING, READ_ONLY, READ_WRITE)
END_TAG = 0x0F  # small resource name
CHECKSUM_KEYWORD = "RV"  # its first byte is the checksum; the rest of VPD-R is reserved


PADDING = " \t\r\n\x00"


def _text(raw):
    return raw.decode("ascii", errors="replace").strip(PADDING)


def _keywords(body, offset):
    """VPD-R keywords -> ({keyword: text}, whole). Stops at RV; a keyword cut off by the end of the data
    is left out and makes it not whole."""
    fields, i = {}, 0
    while i + 3 <= len(body):
        raw = body[i : i + 2]
        if not (raw.isalnum() and raw.isascii()):
            where = "keyword %r at offset %d" % (raw, offset + i)
            raise ParseError(PCI_TOOL, where + " is not two letters or digits")
        keyword, length = raw.decode("ascii"), body[i + 2]
        if keyword == CHECKSUM_KEYWORD:
            return fields, True
        value = body[i + 3 : i + 3 + length]
        if len(value) < length:
            return fields, False
        fields[keyword] = _text(value)
        i += 3 + length
    return fields, i == len(body)


def parse_pci_vpd(data):
    """PCI VPD bytes -> {"name": identifier string or None, "fields": {keyword: text} of the read-only
    section (SN: board serial, PN: part number, EC, V0..VZ), "complete": bool}.

    Truncated data (a short read) keeps every keyword read whole and says complete False; bytes that
    are not VPD at all (an unprogrammed EEPROM reads 0xff, a broken one zeros) are a ParseError."""
    if not data:
        raise ParseError(PCI_TOOL, "no data")
    name, fields, pos = None, {}, 0
    while pos < len(data):
        tag = data[pos]
        if not tag & 0x80:
            if (tag >> 3) & 0x0F == END_TAG:
                return {"name": name, "fields": fields, "complete": True}
            where = "small resource tag 0x%02x at offset %d" % (tag, pos)
            raise ParseError(PCI_TOOL, where + " is not the end tag")
        if tag & 0x7F not in LARGE_RESOURCES:
            raise ParseError(PCI_TOOL, "unknown resource tag 0x%02x at offset %d" % (tag, pos))
        if pos + 3 > len(data):
            break
        length = data[pos + 1] | data[pos + 2] << 8
        body = data[pos + 3 : pos + 3 + length]
        if tag & 0x7F == IDENTIFIER_STRING and len(body) == length:
            name = _text(body)
        elif tag & 0x7F == READ_ONLY:
            readonly, whole = _keywords(body, pos + 3)
            fields.update(readonly)
            if not whole or len(body) < length:
                break
        if len(body) < length:
            break
        pos += 3 + length
    return {"name": name, "fields": fields, "complete": False}


def parse_scsi_unit_serial(data):
    """vpd_pg80 bytes (peripheral byte, page code 0x80, 2-byte big-endian length, ASCII serial) -> the
    serial without its space or NUL padding (spaces inside are kept), or None when the page holds none."""
    if len(data) < 4:
        raise ParseError(SCSI_TOOL, "header cut short (%d bytes)" % len(data))
    if data[1] != 0x80:
        raise ParseError(SCSI_TOOL, "holds page 0x%02x, not the unit serial number page 0x80" % data[1])
    length = data[2] << 8 | data[3]
    serial = data[4 : 4 + length]
    if len(serial) < length:
        raise ParseError(SCSI_TOOL, "serial truncated: %d of %d bytes" % (len(serial), length))
    return _text(serial) or None
