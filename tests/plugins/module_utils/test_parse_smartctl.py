"""smartctl -j parser on the public samples (ATA and NVMe)."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvme_feature import parse_get_feature
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.smartctl import (
    parse_smartctl_json,
    smart_metrics,
)

from conftest import fixture_text


def metrics(fixture):
    disk = parse_smartctl_json(fixture_text(f"public/smartctl/{fixture}"))
    return disk, {(r["name"]): r["value"] for r in smart_metrics(disk)}


def test_intel_s4500_reallocated_and_wearout():
    disk, rows = metrics("sata_ssd_intel_s4500_realloc4_wear55.json")
    assert disk["device"] == "sdd"
    assert rows["smart_reallocated_sector_ct"] == 4
    assert rows["smart_media_wearout_indicator_normalized"] == 55
    assert rows["smart_media_wearout_indicator"] == 0
    assert rows["smart_health_passed"] == 1


def test_seagate_hdd_reallocated_304():
    _disk, rows = metrics("sata_hdd_seagate_realloc304.json")
    assert rows["smart_reallocated_sector_ct"] == 304


@pytest.mark.parametrize(
    "fixture, name, expected",
    [
        ("sata_ssd_samsung_pm883_healthy.json", "smart_temperature_celsius", 24),  # '24 (Min/Max 21/40)'
        ("sata_hdd_seagate_realloc304.json", "smart_temperature_celsius", 33),  # '33 (0 19 0 0 0)'
        ("sata_hdd_seagate_realloc304.json", "smart_airflow_temperature_cel", 33),
    ],
)
def test_packed_temperature_raw_takes_the_first_number(fixture, name, expected):
    _disk, rows = metrics(fixture)
    assert rows[name] == expected


def test_nvme_worn_p4500():
    _disk, rows = metrics("nvme_intel_p4500_worn_pctused75.json")
    assert rows["nvme_percentage_used"] == 75 and rows["nvme_available_spare_percent"] == 99


def test_nvme_critical_warning_failed_drive():
    disk, rows = metrics("nvme_samsung_pm1725a_critwarn16_failed.json")
    assert rows["nvme_critical_warning"] == 16 and rows["smart_health_passed"] == 0
    assert disk["exit_status"] == 8


@pytest.mark.parametrize("text", ["", "{", '{"device": {}}', "smartctl 7.3 (plain text, not -j)\n"])
def test_not_smartctl_json(text):
    with pytest.raises(ParseError) as caught:
        parse_smartctl_json(text)
    assert caught.value.tool == "smartctl -j"


def test_nvme_get_feature_volatile_write_cache():
    # No real capture exists; the lab's SYNTHETIC sample follows nvme-cli's documented line.
    assert parse_get_feature("get-feature:0x06 (Volatile Write Cache), Current value:0x00000001") == 1
    with pytest.raises(ParseError):
        parse_get_feature("NVMe status: Invalid Field in Command(0x2)")


def test_duplicate_attribute_names_stay_apart():
    disk = parse_smartctl_json(fixture_text("public/smartctl/sata_ssd_intel_s4500_realloc4_wear55.json"))
    rows = [r for r in smart_metrics(disk) if r["name"] == "smart_available_reservd_space"]
    assert len(rows) == 2 and {r["labels"]["attribute_id"] for r in rows} == {"170", "232"}
