# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parsers for /sys/class/infiniband attributes, `ibv_devinfo`, `ibstat` and `rdma -j res show qp`."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    expect,
    first_nonblank,
    load_json,
)

# Legacy (non-extended) port counters are narrow and stop at their maximum instead of wrapping.
LEGACY_COUNTER_MAX = {
    "link_downed": 0xFF,
    "link_error_recovery": 0xFF,
    "symbol_error": 0xFFFF,
    "port_rcv_errors": 0xFFFF,
    "port_xmit_discards": 0xFFFF,
    "port_xmit_wait": 0xFFFFFFFF,
}
PORT_COUNTER_METRICS = {
    "symbol_error": "ib_symbol_errors_total",
    "link_downed": "ib_link_downed_total",
    "link_error_recovery": "ib_link_error_recovery_total",
    "port_rcv_errors": "ib_port_rcv_errors_total",
    "port_xmit_discards": "ib_port_xmit_discards_total",
    "port_xmit_wait": "ib_port_xmit_wait_total",
}
HW_COUNTER_METRICS = {
    "local_ack_timeout_err": "rdma_local_ack_timeout_errors_total",
    "rnr_nak_retry_err": "rdma_rnr_nak_retry_errors_total",
    "out_of_buffer": "rdma_out_of_buffer_total",
}
PORT_STATES = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}


def parse_numbered_state(tool, text):
    """'4: ACTIVE' (sysfs state) / '5: LinkUp' (phys_state) -> (4, 'ACTIVE')."""
    match = re.match(r"\s*(\d+):\s*(\S+)", text or "")
    if not match:
        raise ParseError(tool, "expected '<number>: <NAME>'", 1, text)
    return int(match.group(1)), match.group(2)


def parse_rate(tool, text):
    """'400 Gb/sec (4X NDR)' -> 400.0."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text or "")
    if not match:
        raise ParseError(tool, "expected '<N> Gb/sec ...'", 1, text)
    return float(match.group(1))


def parse_counter(tool, text):
    """A sysfs counter: an integer, or None where the HCA has no PMA ('N/A (no PMA)')."""
    text = (text or "").strip()
    if text.startswith("N/A"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ParseError(tool, "counter %r is not an integer" % text, 1, text) from None


def parse_ibv_devinfo(text):
    """`ibv_devinfo` -> {(hca, port): {"state", "active_mtu", "max_mtu", "link_layer"}}."""
    tool = "ibv_devinfo"
    ports, hca, port = {}, None, None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        key, sep, value = stripped.partition(":")
        if not sep:
            raise ParseError(tool, "expected '<field>: <value>'", number, line)
        key, value = key.strip(), value.strip()
        if key == "hca_id":
            hca, port = value, None
        elif key == "port":
            if hca is None:
                raise ParseError(tool, "port before hca_id", number, line)
            if not value.isdigit():
                raise ParseError(tool, "port number %r is not a number" % value, number, line)
            port = int(value)
            ports[(hca, port)] = {}
        elif port is not None and key in ("state", "active_mtu", "max_mtu", "link_layer"):
            # "PORT_ACTIVE (4)" -> 4; "4096 (5)" -> 4096 (the MTU in bytes, not its enum)
            number_match = None
            if key == "state":
                number_match = re.search(r"\((\d+)\)", value)
            elif key != "link_layer":
                number_match = re.match(r"(\d+)", value)
            ports[(hca, port)][key] = int(number_match.group(1)) if number_match else value
    if not ports and text.strip() and "No IB devices found" not in text:
        line_no, line = first_nonblank(text)
        raise ParseError(tool, "no 'hca_id'/'port' blocks", line_no, line)
    return ports


def parse_ibstat(text):
    """`ibstat` -> {(ca, port): {"state", "phys_state", "rate", "link_layer"}} (fallback for sysfs)."""
    tool = "ibstat"
    ports, ca, port = {}, None, None
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        match = re.match(r"CA '([^']+)'", stripped)
        if match:
            ca, port = match.group(1), None
            continue
        match = re.match(r"Port (\d+):$", stripped)
        if match:
            if ca is None:
                raise ParseError(tool, "Port before CA", number, line)
            port = int(match.group(1))
            ports[(ca, port)] = {}
            continue
        if stripped.startswith("ibpanic:") or stripped.startswith("ibwarn:"):
            raise ParseError(tool, stripped, number, line)
        key, sep, value = stripped.partition(":")
        if not sep:
            raise ParseError(tool, "expected '<field>: <value>'", number, line)
        if port is None:
            continue
        value = value.strip()
        if key == "State":
            ports[(ca, port)]["state"] = PORT_STATES.get(value.upper(), 0)
        elif key == "Physical state":
            ports[(ca, port)]["phys_state_name"] = value
        elif key == "Rate":
            ports[(ca, port)]["rate"] = float(value) if value.replace(".", "", 1).isdigit() else None
        elif key == "Link layer":
            ports[(ca, port)]["link_layer"] = value
    return ports


def parse_rdma_qp_json(text):
    """`rdma -j res show qp` -> {"mlx5_0/1": {"total": n, "error": n}} (QPs in ERR state)."""
    tool = "rdma -j res show qp"
    data = expect(tool, load_json(tool, text or "[]"), list, "queue pairs")
    counts = {}
    for qp in data:
        if not isinstance(qp, dict) or "ifname" not in qp:
            raise ParseError(tool, "queue pair without 'ifname': %r" % (qp,))
        key = "%s/%s" % (qp["ifname"], qp.get("port", 1))
        entry = counts.setdefault(key, {"total": 0, "error": 0})
        entry["total"] += 1
        if str(qp.get("state", "")).upper() == "ERR":
            entry["error"] += 1
    return counts
