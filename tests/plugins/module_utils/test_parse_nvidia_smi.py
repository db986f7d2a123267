"""nvidia-smi -q -x and dmon parsers on real captures (H200 VM, A100 MIG, Tesla T4, H100)."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import (
    CLOCK_EVENT_BITS,
    dmon_metrics,
    gpu_metrics,
    parse_dmon,
    parse_query_xml,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

from conftest import fixture_text


def by_name(rows, name, device="gpu0"):
    return [r["value"] for r in rows if r["name"] == name and r["device"] == device]


def test_h200_idle_capture():
    parsed = parse_query_xml(fixture_text("real/h200-vm/commands/nvidia-smi_-q_-x.xml"))
    assert parsed["driver_version"] == "580.159.04"
    (gpu,) = parsed["gpus"]
    assert gpu["name"] == "NVIDIA H200" and gpu["bus_id"] == "00000000:00:06.0"
    assert gpu["temperature_celsius"] == 35 and gpu["memory_temperature_celsius"] == 36
    assert gpu["power_watts"] == pytest.approx(121.28)  # average, not the instant 81.25
    assert gpu["clock_event_mask"] == CLOCK_EVENT_BITS["gpu_idle"]
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": 0, "failure": 0}
    assert gpu["retired_pages_sbe"] is None  # N/A on HBM3e: row remapping replaces page retirement
    rows = gpu_metrics(parsed["gpus"])
    assert by_name(rows, "gpu_pcie_link_width") == [16]
    assert by_name(rows, "gpu_ecc_uncorrected_volatile_total") == [0]
    assert not by_name(rows, "gpu_retired_pages_total")


def test_h200_under_load_shows_the_power_cap():
    parsed = parse_query_xml(fixture_text("real/h200-vm/under-load/nvidia-smi_-q_-x_under_load.xml"))
    gpu = parsed["gpus"][0]
    assert "sw_power_cap" in gpu["clock_events_active"]
    assert gpu["clock_event_mask"] & CLOCK_EVENT_BITS["sw_power_cap"]
    assert gpu["power_watts"] > 600


def test_t4_old_throttle_tag_and_no_row_remapper():
    parsed = parse_query_xml(fixture_text("public/nvidia-smi/q_xml_tesla-t4_515.105.01.xml"))
    gpu = parsed["gpus"][0]
    assert gpu["clock_event_mask"] == 0  # clocks_throttle_reasons, all Not Active
    assert gpu["remapped_rows"] is None
    assert (gpu["pcie_link_width"], gpu["pcie_link_width_max"]) == (8, 16)
    assert gpu["power_watts"] == pytest.approx(26.78)
    assert gpu["retired_pages_sbe"] == 0 and gpu["retired_pages_dbe"] == 0
    assert not by_name(gpu_metrics(parsed["gpus"]), "gpu_remapped_rows_pending")


def test_a100_mig_capture():
    parsed = parse_query_xml(fixture_text("public/nvidia-smi/q_xml_a100-sxm4-80gb_mig_535.54.03.xml"))
    gpu = parsed["gpus"][0]
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["power_watts"] == pytest.approx(67.03)
    assert gpu["utilization_percent"] is None  # N/A under MIG: unknown, not zero
    assert not by_name(gpu_metrics(parsed["gpus"]), "gpu_utilization_percent")


@pytest.mark.parametrize(
    "text, line_no",
    [("<nvidia_smi_log><gpu></nvidia_smi_log>", 1), ("hello\nworld", 1), ("<other/>", 1)],
)
def test_garbage_xml_names_the_tool_and_line(text, line_no):
    with pytest.raises(ParseError) as caught:
        parse_query_xml(text)
    assert caught.value.tool == "nvidia-smi -q -x" and caught.value.line_no == line_no


def test_dmon_h200_pcie_columns():
    samples = parse_dmon(fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt"))
    rows = dmon_metrics(samples)
    assert by_name(rows, "gpu_pcie_tx_mb_per_s") == [pytest.approx(0.2)]
    assert by_name(rows, "gpu_thermal_violation") == [0]


def test_dmon_under_load_power_violation():
    rows = dmon_metrics(parse_dmon(fixture_text("real/h200-vm/under-load/nvidia-smi_dmon_under_load.txt")))
    assert by_name(rows, "gpu_power_violation_percent")[0] > 50


def test_dmon_h100_without_pci_columns_gives_no_pcie_rows():
    rows = dmon_metrics(parse_dmon(fixture_text("public/nvidia-smi/dmon_h100_load_590.48.01.txt")))
    assert not by_name(rows, "gpu_pcie_rx_mb_per_s")


def test_dmon_short_line_is_a_parse_error():
    text = fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt") + "    0     80\n"
    with pytest.raises(ParseError) as caught:
        parse_dmon(text)
    assert caught.value.line_no == 8
