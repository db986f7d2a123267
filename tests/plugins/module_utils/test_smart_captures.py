"""smartctl -j captures from other machines: SAS disks (grown defects, uncorrected errors, their model),
per-attribute WHEN_FAILED, and disks behind a MegaRAID controller named by their slot and serial."""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_smart
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.smartctl import (
    parse_smartctl_json,
    smart_metrics,
)
from stethoscope.catalog import Catalog
from stethoscope.names import is_device_name

from conftest import fake_tools, fixture_text, run_module

SAS_FAILING = "sas_seagate_st373453lc_grown260_uncorrected.json"
SAS_MEGARAID = "sas_megaraid0_toshiba_al15seb24eqy.json"
SAS_MEGARAID_OLD_KEYS = "sas_megaraid1_toshiba_mg08sca16tey_smartctl72.json"
SATA_MEGARAID = "sata_megaraid0_samsung_mz7kh480_exit4.json"
WHEN_FAILED = "sata_hdd_wd3200bevt_when_failed_now_exit216.json"
CATALOG = Catalog.load()


def parsed(fixture):
    return parse_smartctl_json(fixture_text(f"public/smartctl/{fixture}"))


def rows_of(fixture):
    return smart_metrics(parsed(fixture))


def value(rows, name, **labels):
    (match,) = [
        r for r in rows if r["name"] == name and all(r["labels"].get(k) == v for k, v in labels.items())
    ]
    return match["value"]


def test_sas_disk_reports_its_grown_defects_and_uncorrected_errors():
    disk = parsed(SAS_FAILING)
    rows = smart_metrics(disk)
    assert disk["model"] == "SEAGATE ST373453LC" and disk["protocol"] == "SCSI"
    assert value(rows, "disk_grown_defects_total") == 260
    assert value(rows, "disk_uncorrected_errors_total", operation="read") == 1
    assert value(rows, "disk_uncorrected_errors_total", operation="write") == 535
    # this drive keeps no verify error counter log: no row, not a zero
    assert [r for r in rows if r["labels"].get("operation") == "verify"] == []
    assert value(rows, "smart_health_passed") == 1 and value(rows, "disk_temperature_celsius") == 33


def test_healthy_sas_disk_behind_megaraid_reads_zero_and_has_its_model():
    disk = parsed(SAS_MEGARAID)
    rows = smart_metrics(disk)
    assert disk["model"] == "TOSHIBA AL15SEB24EQY"
    assert value(rows, "disk_grown_defects_total") == 0
    assert {r["labels"]["operation"] for r in rows if r["name"] == "disk_uncorrected_errors_total"} == {
        "read",
        "write",
        "verify",
    }


def test_older_smartctl_names_the_sas_model_model_name():
    assert parsed(SAS_MEGARAID_OLD_KEYS)["model"] == "TOSHIBA MG08SCA16TEY"


@pytest.mark.parametrize(
    "fixture, device",
    [
        (SAS_MEGARAID, "bus0:megaraid,0"),
        (SAS_MEGARAID_OLD_KEYS, "bus0:megaraid,1"),
        (SATA_MEGARAID, "bus0:megaraid,0"),  # -d sat+megaraid,0: the slot is the same kind of name
    ],
)
def test_a_disk_behind_megaraid_is_named_by_its_controller_and_slot(fixture, device):
    disk = parsed(fixture)
    assert disk["device"] == device and disk["slot"] == device.split(":")[1]
    assert is_device_name(device) and re.fullmatch(CATALOG.device_kinds["disk"].pattern, device)
    rows = smart_metrics(disk)
    assert {r["device"] for r in rows} == {device}
    # the serial on every row: a disk swapped in the same slot is another series
    assert {r["labels"]["serial"] for r in rows} == {"REDACTED"}


def test_a_plain_disk_keeps_its_block_device_name_and_no_serial_label():
    disk = parsed(SAS_FAILING)
    assert disk["device"] == "sdb" and disk["slot"] is None
    assert all("serial" not in r["labels"] for r in smart_metrics(disk))


def test_when_failed_now_and_past_become_a_metric_per_attribute():
    disk = parsed(WHEN_FAILED)
    rows = smart_metrics(disk)
    assert disk["exit_status"] == 216 and disk["health_passed"] is False
    assert value(rows, "smart_attribute_failing", attribute="reallocated_sector_ct") == 2  # now
    assert value(rows, "smart_attribute_failing", attribute="airflow_temperature_cel") == 1  # in the past
    assert value(rows, "smart_attribute_failing", attribute="spin_up_time") == 0
    # an attribute whose threshold is 0 can never fail: no row for it
    assert not [r for r in rows if r["labels"].get("attribute") == "power_on_hours"]


def test_an_unknown_when_failed_is_a_parse_error_naming_the_attribute():
    text = fixture_text(f"public/smartctl/{WHEN_FAILED}").replace(
        '"when_failed": "now"', '"when_failed": "soon"'
    )
    with pytest.raises(ParseError) as caught:
        parse_smartctl_json(text)
    assert caught.value.tool == "smartctl -j" and "Reallocated_Sector_Ct" in str(caught.value)


class ReplayContext:
    """The collector's context with smartctl answered from a capture, recording each argv."""

    timeout = 30

    def __init__(self, answers):
        self.answers, self.argvs = answers, []

    def which(self, name):
        return "/usr/sbin/" + name

    def listdir(self, path):
        return ["sda"]

    def path(self, path):
        return path

    def run(self, argv):
        self.argvs.append(argv)
        return self.answers[argv[-1]]


def test_the_collector_reads_a_megaraid_slot_with_its_device_type():
    ctx = ReplayContext({"/dev/bus/0": (0, fixture_text(f"public/smartctl/{SAS_MEGARAID}"), "")})
    result = collect_smart.collect(ctx, ["/dev/bus/0 -d megaraid,0"])
    assert ctx.argvs == [["smartctl", "-j", "-a", "-d", "megaraid,0", "/dev/bus/0"]]
    assert list(result["facts"]["disks"]) == ["bus0:megaraid,0"]
    assert result["facts"]["disks"]["bus0:megaraid,0"]["model"] == "TOSHIBA AL15SEB24EQY"


def test_a_megaraid_slot_that_fails_is_named_as_its_rows_are():
    """The failure of a disk behind MegaRAID is the disk's series (`bus0:megaraid,0`), the one its
    readings had, not the option text the operator wrote."""
    ctx = ReplayContext({"/dev/bus/0": (124, "", "")})
    (failure,) = collect_smart.collect(ctx, ["/dev/bus/0 -d megaraid,0"])["failures"]
    assert failure["device"] == "bus0:megaraid,0"


def test_disks_behind_megaraid_are_found_by_smartctl_scan_when_no_devices_are_given():
    """/sys/block shows only the controller's virtual disk; `smartctl --scan` lists the physical disks
    behind it (glouton's capture of a Proxmox host), and each is read through the controller."""
    scan = fixture_text("public/smartctl/scan_proxmox_megaraid14_glouton.txt")
    ctx = ReplayContext(
        {"--scan": (0, scan, ""), "/dev/sda": (0, fixture_text(f"public/smartctl/{SAS_FAILING}"), "")}
    )
    ctx.answers["/dev/bus/0"] = (0, fixture_text(f"public/smartctl/{SAS_MEGARAID}"), "")
    collect_smart.collect(ctx)
    assert ctx.argvs[0] == ["smartctl", "--scan"]
    assert ctx.argvs[1:] == [["smartctl", "-j", "-a", "/dev/sda"]] + [
        ["smartctl", "-j", "-a", "-d", f"megaraid,{n}", "/dev/bus/0"] for n in range(14)
    ]


def test_a_scan_without_raid_adds_no_disk_to_those_of_sys_block():
    ctx = ReplayContext(
        {
            "--scan": (0, fixture_text("public/smartctl/scan_home_sata2_nvme1_glouton.txt"), ""),
            "/dev/sda": (0, fixture_text(f"public/smartctl/{SAS_FAILING}"), ""),
        }
    )
    result = collect_smart.collect(ctx)
    assert ctx.argvs[1:] == [["smartctl", "-j", "-a", "/dev/sda"]] and not result["warnings"]


def test_an_odd_line_of_smartctl_scan_is_said_and_the_other_raid_disks_still_read():
    scan = fixture_text("public/smartctl/scan_proxmox_megaraid14_glouton.txt").splitlines()
    scan.insert(3, "smartctl: something unexpected")
    ctx = ReplayContext(
        {
            "--scan": (0, "\n".join(scan) + "\n", ""),
            "/dev/sda": (0, fixture_text(f"public/smartctl/{SAS_FAILING}"), ""),
            "/dev/bus/0": (0, fixture_text(f"public/smartctl/{SAS_MEGARAID}"), ""),
        }
    )
    result = collect_smart.collect(ctx)
    assert len(ctx.argvs) == 1 + 1 + 14
    (warning,) = [w for w in result["warnings"] if "--scan" in w]
    assert "line 4" in warning and "something unexpected" in warning


@pytest.mark.parametrize("entry", ["", "   "])
def test_an_empty_device_entry_is_refused_by_name_not_a_traceback(entry):
    assert collect_smart.refused_devices(["sda", entry]) == ["smart_facts devices: an empty entry"]


def test_a_device_entry_of_another_shape_is_refused():
    with pytest.raises(CollectorError, match="megaraid"):
        collect_smart.collect(ReplayContext({}), ["/dev/bus/0 megaraid,0"])


def test_smart_facts_module_reads_a_megaraid_slot_and_a_sas_disk(tmp_path):
    """Through Ansible, smartctl replayed at the process boundary from the captures."""
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(
        bindir,
        log,
        {
            "smartctl": {
                "-j -a -d megaraid,0 /dev/bus/0": f"public/smartctl/{SAS_MEGARAID}",
                "-j -a /dev/sdb": f"public/smartctl/{SAS_FAILING}",
            }
        },
    )
    args = {"devices": ["/dev/bus/0 -d megaraid,0", "sdb"], "state_dir": str(tmp_path / "s")}
    result = run_module(tmp_path, "smart_facts", args, bindir)
    assert log.read_text().splitlines() == [
        "smartctl -j -a -d megaraid,0 /dev/bus/0",
        "smartctl -j -a /dev/sdb",
    ]
    assert result["failed"] is False
    disks = result["ansible_facts"]["stethoscope_smart"]["disks"]
    assert sorted(disks) == ["bus0:megaraid,0", "sdb"] and disks["sdb"]["model"] == "SEAGATE ST373453LC"
    rows = result["stethoscope_metrics"]
    sdb, slot = ([r for r in rows if r["device"] == device] for device in ("sdb", "bus0:megaraid,0"))
    assert value(sdb, "disk_uncorrected_errors_total", operation="write") == 535
    assert value(slot, "disk_uncorrected_errors_total", operation="write") == 0
    assert value(slot, "smart_health_passed", serial="REDACTED") == 1


def test_a_devices_list_with_a_bad_entry_is_refused_before_any_disk_is_read(tmp_path):
    """A mistyped `devices` entry is the operator's configuration, not a broken instrument: the task
    fails naming it, smartctl never runs, and no collector_failed row reads as a disk problem."""
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(bindir, log, {"smartctl": {"-j -a /dev/sdb": f"public/smartctl/{SAS_FAILING}"}})
    args = {"devices": ["sdb", "/dev/bus/0 megaraid,0"], "state_dir": str(tmp_path / "s")}
    result = run_module(tmp_path, "smart_facts", args, bindir)
    assert result["failed"] is True and "'/dev/bus/0 megaraid,0'" in result["msg"]
    assert not log.exists() or log.read_text() == ""
    assert not result.get("stethoscope_metrics")


def test_a_raid_volume_smartctl_cannot_open_is_said_not_a_failure():
    """smartctl's words for a MegaRAID/PERC virtual disk (smartmontools os_linux.cpp, set_err): not a
    disk that stopped answering, so a warning as before, never a collector failure; a disk that is
    gone ("No such device") still is one."""
    raid = {
        "json_format_version": [1, 0],
        "smartctl": {
            "exit_status": 2,
            "messages": [
                {
                    "string": "Smartctl open device: /dev/sda failed: DELL or MegaRaid controller, "
                    "please try adding '-d megaraid,N'",
                    "severity": "error",
                }
            ],
        },
    }
    gone = {
        **raid,
        "smartctl": {
            **raid["smartctl"],
            "messages": [
                {"string": "Smartctl open device: /dev/sda failed: No such device", "severity": "error"}
            ],
        },
    }
    result = collect_smart.collect(ReplayContext({"/dev/sda": (2, json.dumps(raid), "")}), ["sda"])
    assert result["failures"] == [] and "please try adding '-d megaraid,N'" in result["warnings"][0]
    result = collect_smart.collect(ReplayContext({"/dev/sda": (2, json.dumps(gone), "")}), ["sda"])
    assert [f["cause"] for f in result["failures"]] == ["disk_unreadable"]
