"""XID kernel-log and NVLink parsers on real captures."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.kernel_log import (
    normalize_bdf,
    parse_xid_events,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvlink import (
    parse_errors,
    parse_status,
    parse_throughput,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

from conftest import fixture_text


def test_xid_lines_in_dmesg_T_format():
    events = parse_xid_events(fixture_text("public/dmesg/xid_31_48_dmesg-T_gcm.txt"))
    assert [(e["xid"], e["bdf"]) for e in events] == [(31, "000d:00:00"), (48, "000d:00:00")]
    assert events[0]["monotonic"] is None  # -T has wall-clock stamps only


def test_h200_kernel_log_has_no_xid():
    assert parse_xid_events(fixture_text("real/h200-vm/commands/dmesg_nvrm_lines.txt")) == []


def test_kmsg_records_are_not_xids():
    assert parse_xid_events(fixture_text("public/dmesg/kmsg_nvidia-peermem_invalid_context.txt")) == []


@pytest.mark.parametrize(
    "raw, expected",
    [("PCI:0000:00:06", "0000:00:06"), ("00000000:00:06.0", "0000:00:06"), ("000d:00:00", "000d:00:00")],
)
def test_bus_ids_from_xid_and_nvidia_smi_agree(raw, expected):
    assert normalize_bdf(raw) == expected


def test_nvlink_status_8xa100():
    gpus = parse_status(fixture_text("public/nvidia-smi/nvlink_status_8xA100_gpud.txt"))
    assert sorted(gpus) == list(range(8))
    assert all(
        len(g["links"]) == 12 and all(link["up"] for link in g["links"].values()) for g in gpus.values()
    )
    assert gpus[0]["links"][0]["speed_gb_s"] == 25


def test_nvlink_status_h100_tab_indented():
    gpus = parse_status(fixture_text("public/nvidia-smi/nvlink_status_h100_590.48.01.txt"))
    assert gpus[0]["links"][0]["speed_gb_s"] == pytest.approx(26.562)


def test_all_links_inactive_is_a_fact_not_absence():
    gpus = parse_status(fixture_text("public/nvidia-smi/nvlink_status_a100_all_links_inactive_UNHEALTHY.txt"))
    assert gpus == {
        6: {
            "name": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-9667d95e-6d22-0c22-1f57-c481f13e7c44",
            "all_inactive": True,
            "links": {},
        }
    }


def test_h200_without_nvlink_prints_nothing():
    assert parse_status(fixture_text("real/h200-vm/commands/nvidia-smi_nvlink_--status.txt")) == {}
    assert parse_errors(fixture_text("real/h200-vm/commands/nvidia-smi_nvlink_-e.txt")) == {}


def test_error_and_throughput_counters():
    # No real `nvlink -e` / `-gt d` sample exists (fixtures README); these follow nvidia-smi's format.
    errors = parse_errors("GPU 0: X (UUID: GPU-1)\n\t Link 0: Replay Errors: 1\n\t Link 0: CRC Errors: 7\n")
    assert errors == {0: {0: {"replay": 1, "crc": 7}}}
    data = parse_throughput(
        "GPU 0: X (UUID: GPU-1)\n\t Link 1: Data Tx: 2 MiB\n\t Link 1: Data Rx: 512 KiB\n"
    )
    assert data == {0: {1: {"data_kib": 2560}}}


def test_nvlink_garbage_names_the_line():
    with pytest.raises(ParseError) as caught:
        parse_status("GPU 0: X\n\t Link zero: up\n")
    assert caught.value.line_no == 2 and "nvlink -s" in caught.value.tool
