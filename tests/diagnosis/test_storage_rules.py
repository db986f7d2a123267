"""The shipped SMART, NVMe and SAS rules fed with the rows the collector makes of real smartctl captures
(plugins/module_utils/smartctl.py on tests/fixtures/public/smartctl): each fires on the drive that
shows the fault and stays quiet on healthy drives and on old history that does not grow."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.smartctl import (
    parse_smartctl_json,
    smart_metrics,
)
from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

from conftest import FIXTURES, TOP, ansible_env, fake_tools, fixture_text

CATALOG = Catalog.load()
RULES = {rule.rule_id: rule for rule in load_rules(TOP / "rules", CATALOG).rules}
AT = now_ms() - 30_000
SWEEP = 60_000

FAILING_HDD = "sata_hdd_wd3200bevt_when_failed_now_exit216.json"  # exit 216: bits 3, 4, 6, 7
FAILED_NVME = "nvme_samsung_pm1725a_critwarn16_failed.json"  # health FAILED, exit 8
HEALTHY_SATA = "sata_ssd_samsung_pm883_healthy.json"
HEALTHY_NVME = "nvme_samsung_pm9a3_healthy.json"
REALLOCATED_HDD = "sata_hdd_seagate_realloc304.json"  # 304 reallocated, nothing past its threshold
MEGARAID_SATA_EXIT4 = "sata_megaraid0_samsung_mz7kh480_exit4.json"  # a SMART command failed: bit 2 only
SAS_OLD_ERRORS = "sas_seagate_st373453lc_grown260_uncorrected.json"  # 260 defects, 535 write errors
SAS_MEGARAID = "sas_megaraid0_toshiba_al15seb24eqy.json"


def disk(fixture):
    return parse_smartctl_json(fixture_text(f"public/smartctl/{fixture}"))


def sweeps(store, node, *disks):
    """One sweep a minute, the last at AT: the collector's rows of each disk state in turn."""
    batch = MetricColumns()
    for index, state in enumerate(disks):
        at = AT - (len(disks) - 1 - index) * SWEEP
        for row in smart_metrics(state):
            batch.append(node, row["name"], row["device"], row["labels"], row["value"], at)
    store.insert_metrics(batch)


def fired(store, rule_id):
    return sorted((m.node_id, m.device) for m in evaluate(store, RULES[rule_id], AT))


def grown(state, **changes):
    """The same drive a sweep later, its counters grown by `changes`."""
    later = copy.deepcopy(state)
    for key, increase in changes.items():
        if key == "media_errors":
            later["nvme_health"]["media_errors"] += increase
        elif key == "grown_defects":
            later["scsi_health"]["grown_defects"] += increase
        else:
            later["scsi_health"]["uncorrected_errors"][key] += increase
    return later


@pytest.mark.parametrize(
    "rule_id, failing, healthy",
    [
        # an NVMe drive's FAILED is its critical warning, which nvme_critical_warning_media reads by bit
        ("smart_disk_failing", [FAILING_HDD], [HEALTHY_SATA, HEALTHY_NVME, SAS_OLD_ERRORS, FAILED_NVME]),
        ("nvme_critical_warning_media", [FAILED_NVME], [HEALTHY_NVME]),
        ("smart_attribute_failing_now", [FAILING_HDD], [HEALTHY_SATA, REALLOCATED_HDD, FAILED_NVME]),
        ("smart_attribute_failed_in_past", [FAILING_HDD], [HEALTHY_SATA, REALLOCATED_HDD]),
        ("smart_error_log_has_errors", [FAILING_HDD], [HEALTHY_SATA, MEGARAID_SATA_EXIT4]),
        ("smart_self_test_failed", [FAILING_HDD], [HEALTHY_SATA, MEGARAID_SATA_EXIT4, FAILED_NVME]),
    ],
)
def test_smartctl_verdicts_fire_on_the_failing_drive_only(store, rule_id, failing, healthy):
    for index, fixture in enumerate(failing):
        sweeps(store, f"bad{index}", disk(fixture), disk(fixture))
    for index, fixture in enumerate(healthy):
        sweeps(store, f"good{index}", disk(fixture), disk(fixture))
    assert [node for node, _device in fired(store, rule_id)] == [f"bad{i}" for i in range(len(failing))]


def test_the_failing_drive_is_named_by_its_device():
    assert disk(FAILING_HDD)["device"] == "sdb"


def test_a_failing_hdd_is_one_incident_family_across_its_verdicts():
    families = {
        RULES[r].family
        for r in ("smart_disk_failing", "smart_attribute_failing_now", "smart_self_test_failed")
    }
    assert families == {"smart_disk"}


def test_new_nvme_media_errors_fire_and_a_steady_count_does_not(store):
    nvme = disk(HEALTHY_NVME)
    sweeps(store, "bad", nvme, nvme, grown(nvme, media_errors=2))
    sweeps(store, "good", nvme, nvme, nvme)
    assert fired(store, "nvme_media_errors_rising") == [("bad", "nvme0")]  # the capture names /dev/nvme0


def test_new_sas_uncorrected_errors_fire_and_old_ones_do_not(store):
    sas = disk(SAS_OLD_ERRORS)  # 535 uncorrected write errors from its past
    sweeps(store, "bad", sas, sas, grown(sas, read=1))
    sweeps(store, "good", sas, sas, sas)
    assert fired(store, "sas_uncorrected_errors_rising") == [("bad", "sdb")]


def test_sas_grown_defects_growing_fire_and_a_steady_list_does_not(store):
    sas = disk(SAS_OLD_ERRORS)  # 260 grown defects from its past
    sweeps(store, "bad", sas, grown(sas, grown_defects=3))
    sweeps(store, "good", sas, sas, sas)
    assert fired(store, "sas_grown_defects_rising") == [("bad", "sdb")]


def test_a_finding_on_a_disk_behind_megaraid_names_its_slot(store):
    slot = disk(SAS_MEGARAID)
    sweeps(store, "raid", slot, grown(slot, verify=1))
    assert fired(store, "sas_uncorrected_errors_rising") == [("raid", "bus0:megaraid,0")]


@pytest.mark.parametrize("bits", [0x01, 0x04, 0x08, 0x10, 0x20])
def test_every_nvme_critical_warning_bit_but_temperature_is_critical(store, bits):
    failed = disk(FAILED_NVME)  # the real drive: 0x10, volatile memory backup failed
    failed["nvme_health"]["critical_warning"] = bits
    sweeps(store, "bad", failed)
    sweeps(store, "good", disk(HEALTHY_NVME))
    assert [node for node, _device in fired(store, "nvme_critical_warning_media")] == ["bad"]
    assert RULES["nvme_critical_warning_media"].severity == "critical"


def test_a_failing_disk_swept_by_the_real_module_is_a_critical_l4_finding(tmp_path, tmp_dsn):
    """smart_facts through Ansible (smartctl replayed from the capture, with its exit status 216), the
    callback, the store and the shipped rules: the WD3200's FAILED verdict is a critical L4 finding."""
    capture = FIXTURES / "public/smartctl" / FAILING_HDD
    bindir = tmp_path / "bin"
    fake_tools(bindir, tmp_path / "tools.log", {"smartctl": {"-j -a /dev/sdb": f'cat "{capture}"; exit 216'}})
    inventory = tmp_path / "hosts.json"
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"all": {"vars": local, "hosts": {"node01": {}}}}))
    playbook = tmp_path / "sweep.yml"
    playbook.write_text(
        textwrap.dedent(f"""
        - name: Sweep one node's disks
          hosts: node01
          gather_facts: false
          tasks:
            - name: Read SMART
              aicluster.stethoscope.smart_facts:
                devices: [sdb]
                state_dir: "{tmp_path / "state"}"
              environment:
                PATH: "{bindir}:{os.environ["PATH"]}"
        """)
    )
    cli = [sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn]
    subprocess.run([*cli, "db", "init"], check=True, capture_output=True)
    env = ansible_env(tmp_path, tmp_dsn, ANSIBLE_INVENTORY=str(inventory))
    playbook_bin = str(Path(sys.executable).parent / "ansible-playbook")
    sweep = subprocess.run(
        [playbook_bin, str(playbook)], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert sweep.returncode == 0, sweep.stdout[-3000:]
    run = subprocess.run(
        [*cli, "diagnose", "--json"], env=env, cwd=TOP, capture_output=True, text=True, check=False
    )
    assert run.returncode == 1, run.stderr  # a critical finding: the default --fail-on critical
    found = {
        f["rule_id"]: (f["device"], f["severity"], f["level"])
        for f in json.loads(run.stdout)
        if f["node_id"] == "node01"
    }
    assert found["smart_disk_failing"] == ("sdb", "critical", "L4")
    assert found["smart_attribute_failing_now"] == ("sdb", "critical", "L3")
    assert found["smart_self_test_failed"] == ("sdb", "warning", "L3")
