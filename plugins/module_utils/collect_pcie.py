# Copyright: stethoscope developers
# Apache License 2.0
"""PCIe AER counts from sysfs for every device, link degradation, and lspci status bits as fallback."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    result,
    run_checked,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add, metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.pcie import (
    AER_FILES,
    aer_total,
    link_degraded,
    parse_aer_file,
    parse_link_speed,
    parse_link_width,
    parse_lspci_vvv,
)

NAME = "pcie_aer"
DEVICES = "/sys/bus/pci/devices"
# lspci's names of the AER status bits and their place in the register (Linux pci_regs.h
# PCI_ERR_COR_* and PCI_ERR_UNC_*): pcie_aer_status_flags is the register as the device holds it.
CORRECTABLE_STATUS_BITS = {
    "RxErr": 0,
    "BadTLP": 6,
    "BadDLLP": 7,
    "Rollover": 8,
    "Timeout": 12,
    "AdvNonFatalErr": 13,
    "NonFatalErr": 13,  # the same bit as older pciutils name it
    "CorrIntErr": 14,
    "HeaderOF": 15,
}
UNCORRECTABLE_STATUS_BITS = {
    "DLP": 4,
    "SDES": 5,
    "TLP": 12,
    "FCP": 13,
    "CmpltTO": 14,
    "CmpltAbrt": 15,
    "UnxCmplt": 16,
    "RxOF": 17,
    "MalfTLP": 18,
    "ECRC": 19,
    "UnsupReq": 20,
    "ACSViol": 21,
    "UncorrIntErr": 22,
    "BlockedTLP": 23,
    "AtomicOpBlocked": 24,
    "TLPBlockedErr": 25,
    "PoisonTLPBlocked": 26,
    "DMWrReqBlocked": 27,
    "IDECheck": 28,
    "MisIDETLP": 29,
    "PCRC_CHECK": 30,
    "TLPXlatBlocked": 31,
}


def collect(ctx, busy_devices=()):
    bdfs = ctx.listdir(DEVICES)
    if not bdfs:
        return result(False, {"reason": "%s is empty or missing" % ctx.path(DEVICES)})
    busy = {b.lower() for b in busy_devices}
    rows, devices, with_aer = [], {}, 0
    for bdf in bdfs:
        base = "%s/%s/" % (DEVICES, bdf)
        entry = {
            "class": ctx.read(base + "class"),
            "vendor": ctx.read(base + "vendor"),
            "device": ctx.read(base + "device"),
        }
        for file_name, (_total_key, metric_name) in AER_FILES.items():
            text = ctx.read(base + file_name)
            if text is None:
                continue
            try:
                counts = parse_aer_file(file_name, text)
            except ParseError as exc:
                raise CollectorError("%s (%s)" % (exc, ctx.path(base + file_name))) from None
            entry[file_name] = counts
            rows.append(metric(metric_name, bdf, aer_total(file_name, counts)))
        if any(name in entry for name in AER_FILES):
            with_aer += 1
        width, max_width = (
            parse_link_width(ctx.read(base + "current_link_width")),
            parse_link_width(ctx.read(base + "max_link_width")),
        )
        speed, max_speed = (
            parse_link_speed(ctx.read(base + "current_link_speed")),
            parse_link_speed(ctx.read(base + "max_link_speed")),
        )
        if max_width is not None or max_speed is not None:
            entry.update(
                link_width=width,
                max_link_width=max_width,
                link_speed_gt_s=speed,
                max_link_speed_gt_s=max_speed,
            )
            add(
                rows,
                "pcie_link_degraded",
                bdf,
                link_degraded(width, max_width, speed, max_speed, bdf in busy),
            )
        devices[bdf] = entry
    facts = {"devices": devices, "aer_source": "sysfs" if with_aer else None}
    warnings = []
    if not with_aer:
        facts["aer_source"], lspci_rows = _lspci_fallback(ctx, facts, warnings)
        rows += lspci_rows
    return result(True, facts, rows, warnings)


def _lspci_fallback(ctx, facts, warnings):
    """Without AER files, lspci -vvv still shows which AER status bits are set (not counts)."""
    if not ctx.which("lspci"):
        warnings.append("no AER files in sysfs and lspci not found: AER not observable on this node")
        return None, []
    argv = ["lspci", "-vvv"]
    out = run_checked(ctx, argv, "lspci -vvv")
    try:
        parsed = parse_lspci_vvv(out)
    except ParseError as exc:
        raise CollectorError(str(exc), argv, 0, out, "") from None
    rows = []
    for device in parsed:
        for key, kind, bits in (
            ("cesta", "correctable", CORRECTABLE_STATUS_BITS),
            ("uesta", "uncorrectable", UNCORRECTABLE_STATUS_BITS),
        ):
            if device[key] is not None:
                mask = status_bitmask(device[key], bits, device["bdf"], warnings)
                rows.append(metric("pcie_aer_status_flags", device["bdf"], mask, {"kind": kind}))
    facts["lspci"] = parsed
    return "lspci", rows


def status_bitmask(flags, bits, bdf, warnings):
    """The status register from the names of its set flags; a name this table lacks (a newer lspci)
    is warned about rather than dropped unseen."""
    mask = 0
    for flag in flags:
        if flag in bits:
            mask |= 1 << bits[flag]
        else:
            warnings.append("lspci -vvv %s: AER status flag %s+ has no known bit, left out" % (bdf, flag))
    return mask
