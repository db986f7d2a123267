# Copyright: stethoscope developers
# Apache License 2.0
"""Pure parsers for `nvidia-smi -q -x` and `nvidia-smi dmon` output."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
    to_number,
)

TOOL_XML = "nvidia-smi -q -x"
TOOL_DMON = "nvidia-smi dmon"

# NVML's nvmlClocksEventReasons bit values; older drivers call the same bits "throttle reasons".
CLOCK_EVENT_BITS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clocks_setting": 0x100,
}


def _text(node, path):
    found = node.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _num(node, path):
    return to_number(TOOL_XML, _text(node, path))


def _yes(node, path):
    value = _text(node, path)
    if value is None or value in ("N/A", ""):
        return None
    return 1 if value.lower() in ("yes", "true", "active") else 0


def _sum_known(values):
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc(block):
    """(corrected, uncorrected) for one of <volatile>/<aggregate>, for every schema seen."""
    if block is None:
        return None, None
    # DTD v8-v10: <single_bit><total>, <double_bit><total>
    if block.find("single_bit") is not None:
        return _num(block, "single_bit/total"), _num(block, "double_bit/total")
    corrected, uncorrected = [], []
    for child in block:
        if child.tag.endswith("threshold_exceeded"):
            continue
        value = to_number(TOOL_XML, child.text)
        if "uncorrectable" in child.tag:
            uncorrected.append(value)
        elif "correctable" in child.tag:
            corrected.append(value)
    return _sum_known(corrected), _sum_known(uncorrected)


def _clock_events(gpu):
    block = gpu.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if block is None:
        block = gpu.find("clocks_throttle_reasons")
        prefix = "clocks_throttle_reason_"
    if block is None:
        return None, []
    mask, active = 0, []
    for child in block:
        reason = child.tag[len(prefix) :] if child.tag.startswith(prefix) else child.tag
        if (child.text or "").strip() == "Active":
            active.append(reason)
            mask |= CLOCK_EVENT_BITS.get(reason, 0)
    return mask, active


def _remapped_rows(gpu):
    block = gpu.find("remapped_rows")
    if block is None or ((block.text or "").strip() == "N/A" and len(block) == 0):
        return None
    if block.find("remapped_row_corr") is not None:
        return {
            "correctable": _num(block, "remapped_row_corr"),
            "uncorrectable": _num(block, "remapped_row_unc"),
            "pending": _yes(block, "remapped_row_pending"),
            "failure": _yes(block, "remapped_row_failure"),
        }
    return {  # DTD v11 and earlier
        "correctable": _num(block, "correctable_rows"),
        "uncorrectable": _num(block, "uncorrectable_rows"),
        "pending": _yes(block, "pending"),
        "failure": _yes(block, "remap_failure_occurred"),
    }


def _power(gpu):
    for block_name in ("gpu_power_readings", "power_readings"):
        block = gpu.find(block_name)
        if block is None:
            continue
        for field in ("average_power_draw", "power_draw", "instant_power_draw"):
            value = _num(block, field)
            if value is not None:
                return value, _num(block, "current_power_limit") or _num(block, "enforced_power_limit")
    return None, None


def parse_query_xml(text):
    """`nvidia-smi -q -x` -> {"driver_version", "cuda_version", "gpus": [...]} in nvidia-smi's order."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line_no = exc.position[0]
        lines = text.splitlines()
        line = lines[line_no - 1] if 0 < line_no <= len(lines) else None
        raise ParseError(
            TOOL_XML, "not XML (%s)" % exc.msg if hasattr(exc, "msg") else "not XML", line_no, line
        ) from None
    if root.tag != "nvidia_smi_log":
        line_no, line = first_nonblank(text)
        raise ParseError(
            TOOL_XML, "root element is <%s>, expected <nvidia_smi_log>" % root.tag, line_no, line
        )
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        corrected_v, uncorrected_v = _ecc(gpu.find("ecc_errors/volatile"))
        corrected_a, uncorrected_a = _ecc(gpu.find("ecc_errors/aggregate"))
        mask, active = _clock_events(gpu)
        power, power_limit = _power(gpu)
        pending = _yes(gpu, "retired_pages/pending_retirement")
        gpus.append(
            {
                "index": index,
                "device": "gpu%d" % index,
                "bus_id": gpu.get("id") or _text(gpu, "pci/pci_bus_id"),
                "name": _text(gpu, "product_name"),
                "uuid": _text(gpu, "uuid"),
                "serial": _text(gpu, "serial"),
                "vbios_version": _text(gpu, "vbios_version"),
                "pcie_link_gen": _num(gpu, "pci/pci_gpu_link_info/pcie_gen/current_link_gen"),
                "pcie_link_gen_max": _num(gpu, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"),
                "pcie_link_width": _num(gpu, "pci/pci_gpu_link_info/link_widths/current_link_width"),
                "pcie_link_width_max": _num(gpu, "pci/pci_gpu_link_info/link_widths/max_link_width"),
                "pcie_replay_counter": _num(gpu, "pci/replay_counter"),
                "clock_event_mask": mask,
                "clock_events_active": active,
                "memory_used_mib": _num(gpu, "fb_memory_usage/used"),
                "utilization_percent": _num(gpu, "utilization/gpu_util"),
                "ecc_corrected_volatile": corrected_v,
                "ecc_uncorrected_volatile": uncorrected_v,
                "ecc_corrected_aggregate": corrected_a,
                "ecc_uncorrected_aggregate": uncorrected_a,
                "retired_pages_sbe": _num(gpu, "retired_pages/multiple_single_bit_retirement/retired_count"),
                "retired_pages_dbe": _num(gpu, "retired_pages/double_bit_retirement/retired_count"),
                "retired_pages_pending": pending,
                "remapped_rows": _remapped_rows(gpu),
                "temperature_celsius": _num(gpu, "temperature/gpu_temp"),
                "memory_temperature_celsius": _num(gpu, "temperature/memory_temp"),
                "power_watts": power,
                "power_limit_watts": power_limit,
                "sm_clock_mhz": _num(gpu, "clocks/sm_clock"),
                "memory_clock_mhz": _num(gpu, "clocks/mem_clock"),
            }
        )
    return {
        "driver_version": _text(root, "driver_version"),
        "cuda_version": _text(root, "cuda_version"),
        "gpus": gpus,
    }


def gpu_metrics(gpus):
    rows = []
    for gpu in gpus:
        dev = gpu["device"]
        add(rows, "gpu_temperature_celsius", dev, gpu["temperature_celsius"])
        add(rows, "gpu_memory_temperature_celsius", dev, gpu["memory_temperature_celsius"])
        add(rows, "gpu_power_watts", dev, gpu["power_watts"])
        add(rows, "gpu_sm_clock_mhz", dev, gpu["sm_clock_mhz"])
        add(rows, "gpu_memory_clock_mhz", dev, gpu["memory_clock_mhz"])
        add(rows, "gpu_utilization_percent", dev, gpu["utilization_percent"])
        add(rows, "gpu_memory_used_mib", dev, gpu["memory_used_mib"])
        add(rows, "gpu_pcie_replay_errors_total", dev, gpu["pcie_replay_counter"])
        add(rows, "gpu_pcie_link_gen", dev, gpu["pcie_link_gen"])
        add(rows, "gpu_pcie_link_width", dev, gpu["pcie_link_width"])
        add(rows, "gpu_ecc_corrected_volatile_total", dev, gpu["ecc_corrected_volatile"])
        add(rows, "gpu_ecc_uncorrected_volatile_total", dev, gpu["ecc_uncorrected_volatile"])
        add(rows, "gpu_ecc_corrected_aggregate_total", dev, gpu["ecc_corrected_aggregate"])
        add(rows, "gpu_ecc_uncorrected_aggregate_total", dev, gpu["ecc_uncorrected_aggregate"])
        add(rows, "gpu_retired_pages_total", dev, gpu["retired_pages_sbe"], {"cause": "sbe"})
        add(rows, "gpu_retired_pages_total", dev, gpu["retired_pages_dbe"], {"cause": "dbe"})
        add(rows, "gpu_retired_pages_pending", dev, gpu["retired_pages_pending"])
        remapped = gpu["remapped_rows"]
        if remapped:
            add(rows, "gpu_remapped_rows_correctable", dev, remapped["correctable"])
            add(rows, "gpu_remapped_rows_uncorrectable", dev, remapped["uncorrectable"])
            add(rows, "gpu_remapped_rows_pending", dev, remapped["pending"])
            add(rows, "gpu_remapping_failure", dev, remapped["failure"])
        add(rows, "gpu_throttle_reasons_active", dev, gpu["clock_event_mask"])
    return rows


def parse_dmon(text):
    """`nvidia-smi dmon` -> {gpu index: {column: [samples]}}; '-' samples are skipped."""
    columns, samples = None, {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if columns is None:
                columns = stripped.lstrip("#").split()
            continue
        if columns is None:
            raise ParseError(TOOL_DMON, "data before the header", number, line)
        fields = stripped.split()
        if len(fields) != len(columns):
            raise ParseError(
                TOOL_DMON, "%d fields, header has %d" % (len(fields), len(columns)), number, line
            )
        try:
            index = int(fields[0])
        except ValueError:
            raise ParseError(TOOL_DMON, "GPU index %r is not a number" % fields[0], number, line) from None
        per_gpu = samples.setdefault(index, {})
        for name, raw in zip(columns[1:], fields[1:]):
            if raw == "-":
                continue
            try:
                per_gpu.setdefault(name, []).append(float(raw))
            except ValueError:
                message = "%s value %r is not a number" % (name, raw)
                raise ParseError(TOOL_DMON, message, number, line) from None
    if columns is None:
        line_no, line = first_nonblank(text)
        raise ParseError(TOOL_DMON, "no '# gpu ...' header", line_no, line)
    return samples


def _mean(values):
    return sum(values) / len(values) if values else None


def dmon_metrics(samples):
    rows = []
    for index, columns in sorted(samples.items()):
        dev = "gpu%d" % index
        add(rows, "gpu_pcie_rx_mb_per_s", dev, _mean(columns.get("rxpci")))
        add(rows, "gpu_pcie_tx_mb_per_s", dev, _mean(columns.get("txpci")))
        add(rows, "gpu_power_violation_percent", dev, _mean(columns.get("pviol")))
        tviol = columns.get("tviol")
        add(rows, "gpu_thermal_violation", dev, (1 if max(tviol) > 0 else 0) if tviol else None)
    return rows


TOOL_QUERY = "nvidia-smi --query-gpu"


def parse_query_gpu_csv(text):
    """`nvidia-smi --query-gpu=... --format=csv` (with its header) -> [{field: value}] per line.

    Field names lose their unit suffix ("power.draw [W]" -> "power.draw"); values keep nvidia-smi's
    text except that numbers with units become floats and 0x bitmasks become ints.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError(TOOL_QUERY, "empty output", 1, "")
    header = [name.strip().split(" [")[0] for name in lines[0].split(",")]
    if "index" not in header and not any("." in name for name in header):
        raise ParseError(TOOL_QUERY, "first line is not a csv header", 1, lines[0])
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(header):
            raise ParseError(
                TOOL_QUERY, "%d fields, header has %d" % (len(fields), len(header)), number, line
            )
        row = {}
        for name, raw in zip(header, fields):
            if raw.startswith("0x"):
                try:
                    row[name] = int(raw, 16)
                except ValueError:
                    raise ParseError(
                        TOOL_QUERY, "%s value %r is not a bitmask" % (name, raw), number, line
                    ) from None
                continue
            try:
                row[name] = to_number(TOOL_QUERY, raw, number)
            except ParseError:
                row[name] = raw
        rows.append(row)
    return rows
