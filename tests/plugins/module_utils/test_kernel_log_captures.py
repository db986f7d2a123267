"""Kernel-log captures from other machines: a GPU lost without an Xid line (fallen off the bus at run
time or at driver load, RmInitAdapter failed), NVLink5 XIDs of a GB200 and NVSwitch SXids of an HGX.
The parsers on the unedited captures, then the gpu collector and the shipped rules on its rows."""

from __future__ import annotations

from pathlib import Path

from test_xid_first_event import NODE, findings, sweep

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_gpu
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context
from ansible_collections.aicluster.stethoscope.plugins.module_utils.kernel_log import (
    parse_gpu_lost_events,
    parse_sxid_events,
    parse_xid_events,
)
from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

from conftest import REAL, TOP, fixture_text

PROBE_LOST = fixture_text("public/dmesg/gpu_fallen_off_bus_probe_multiline_L40-26b5_nvsentinel_issue155.txt")
HGX_79_SXID = fixture_text("public/dmesg/xid79_nvrm_fallen_off_bus_sxid20034_hgx_gpud_readme.txt")
INIT_FAILED = fixture_text(
    "public/dmesg/rminitadapter_failed_gsp_rtx3090_open-gpu-kernel-modules_issue789.txt"
)
INIT_FAILED_SYSLOG = fixture_text("public/dmesg/rminitadapter_failed_syslog_gpu-operator_issue1146.txt")
XID_149 = fixture_text("public/dmesg/xid149_NETIR_fatal_GB200_kmsg_gpud_pr1174.txt")
XID_145 = fixture_text("public/dmesg/xid145_RLW_RXPIPE_nonfatal_GB200_kmsg_gpud_pr1174.txt")
H200_XML = fixture_text("real/h200-vm/commands/nvidia-smi_-q_-x.xml")
H200_DMON = fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt")
H200_LOG = fixture_text("real/h200-vm/commands/dmesg_nvrm_lines.txt")


def lost(text):
    return [(e["bdf"], e["reason"], e["monotonic"]) for e in parse_gpu_lost_events(text)]


def test_a_gpu_lost_at_driver_load_spans_three_lines_and_is_one_event():
    assert lost(PROBE_LOST) == [("0000:b3:00", "fallen_off_bus", 1843.308145)]
    assert parse_xid_events(PROBE_LOST) == []  # no Xid line at all: before this, nothing was read


def test_the_xid_79_and_the_nvrm_line_of_one_incident_are_each_counted_once():
    assert [(e["bdf"], e["xid"]) for e in parse_xid_events(HGX_79_SXID)] == [("0000:91:00", 79)]
    ((bdf, reason, _),) = lost(HGX_79_SXID)
    assert (bdf, reason) == ("0000:91:00", "fallen_off_bus")
    assert parse_gpu_lost_events(HGX_79_SXID)[0]["line"].endswith(
        "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."
    )


def test_rm_init_adapter_failed_is_one_event_per_attempt():
    assert lost(INIT_FAILED) == [("0000:98:00", "init_failed", 903.610907)]  # not the rm_init_adapter line
    assert lost(INIT_FAILED_SYSLOG) == [("0000:0a:00", "init_failed", None)] * 2  # syslog: no monotonic stamp


def test_nvswitch_sxids_count_headlines_and_attach_their_detail_lines():
    events = parse_sxid_events(HGX_79_SXID)
    assert [(e["switch"], e["bdf"], e["sxid"], e["severity"]) for e in events] == [
        ("nvswitch1", "0000:06:00.0", 20034, "fatal"),
        ("nvswitch0", "0000:05:00.0", 20034, "fatal"),
        # the capture starts inside nvswitch2's event: its Severity line stands for an event of its own
        ("nvswitch2", "0000:07:00.0", 20034, "unknown"),
        ("nvswitch2", "0000:07:00.0", 20034, "fatal"),
        ("nvswitch0", "0000:05:00.0", 20034, "fatal"),
    ]
    assert "Link 48 LTSSM Fault Up" in events[0]["line"]


def test_nvlink5_xids_of_a_gb200_keep_their_domain_and_decode_words():
    (netir,) = parse_xid_events(XID_149)
    assert (netir["bdf"], netir["xid"]) == ("0019:01:00", 149)
    assert netir["detail"].startswith("NETIR Fatal XC0 i0 Link -1 (0x000fe406")
    (rlw,) = parse_xid_events(XID_145)
    assert (rlw["bdf"], rlw["xid"], rlw["detail"].split()[:2]) == (
        "0018:01:00",
        145,
        ["RLW_RXPIPE", "Nonfatal"],
    )


class Node:
    """The H200 capture at the process boundary; `dmesg` prints whatever the test sets."""

    def __init__(self, tmp_path: Path, log: str):
        self.root, self.state, self.log = tmp_path / "root", tmp_path / "state", log
        (self.root / "proc/sys/kernel/random").mkdir(parents=True)
        (self.root / "proc/sys/kernel/random/boot_id").write_text("boot-1\n")

    def sweep(self):
        outputs = {
            ("nvidia-smi", "-q", "-x"): (0, H200_XML),
            ("nvidia-smi", "dmon", "-c", "1", "-s", "pucvmet"): (0, H200_DMON),
            ("dmesg",): (0, self.log),
        }

        def runner(argv, _timeout, _env=None):
            return (*outputs.get(tuple(argv), (127, "")), "")

        context = Context(
            runner, lambda name: f"/usr/bin/{name}", root=str(self.root), state_dir=str(self.state)
        )
        return collect_gpu.collect(context)


def rows_of(result, *names):
    return {
        (row["name"], row["device"], tuple(sorted(row["labels"].items()))): row["value"]
        for row in result["metrics"]
        if row["name"] in names
    }


def test_the_collector_counts_lost_gpus_and_sxids_from_the_second_read_on(tmp_path):
    node = Node(tmp_path, H200_LOG)
    first = node.sweep()  # the first read: the cursor goes to the end of the log
    assert rows_of(first, "gpu_lost_events_total", "nvswitch_sxid_errors_total") == {}
    node.log = H200_LOG + PROBE_LOST + HGX_79_SXID
    second = node.sweep()
    assert rows_of(second, "gpu_lost_events_total", "nvswitch_sxid_errors_total") == {
        ("gpu_lost_events_total", "pci:0000:b3:00", (("reason", "fallen_off_bus"),)): 1,
        ("gpu_lost_events_total", "pci:0000:91:00", (("reason", "fallen_off_bus"),)): 1,
        ("nvswitch_sxid_errors_total", "nvswitch0", (("severity", "fatal"), ("sxid", "20034"))): 2,
        ("nvswitch_sxid_errors_total", "nvswitch1", (("severity", "fatal"), ("sxid", "20034"))): 1,
        ("nvswitch_sxid_errors_total", "nvswitch2", (("severity", "fatal"), ("sxid", "20034"))): 1,
        ("nvswitch_sxid_errors_total", "nvswitch2", (("severity", "unknown"), ("sxid", "20034"))): 1,
    }
    assert rows_of(second, "gpu_xid_errors_total") == {
        ("gpu_xid_errors_total", "pci:0000:91:00", (("xid", "79"),)): 1
    }
    kinds = [(e.get("kind", "xid"), e["device"]) for e in second["facts"]["xid"]["events"]]
    assert ("gpu_lost", "pci:0000:b3:00") in kinds and ("sxid", "nvswitch1") in kinds
    third = node.sweep()  # same log again: nothing new, the counts hold
    assert rows_of(third, "gpu_lost_events_total", "nvswitch_sxid_errors_total") == rows_of(
        second, "gpu_lost_events_total", "nvswitch_sxid_errors_total"
    )
    assert third["facts"]["xid"]["events"] == []


def test_the_shipped_rules_turn_the_collectors_rows_into_findings(tmp_path, store):
    node = Node(tmp_path, H200_LOG)
    sweeps = [node.sweep()]
    node.log = H200_LOG + PROBE_LOST + HGX_79_SXID
    sweeps.append(node.sweep())
    at = now_ms() - 30_000
    batch = MetricColumns()
    for age, result in zip((120_000, 0), sweeps, strict=True):
        for row in result["metrics"]:
            batch.append("hgx-01", row["name"], row["device"], row["labels"], row["value"], at - age)
    store.insert_metrics(batch)
    rules = {r.rule_id: r for r in load_rules(TOP / "rules/gpu", Catalog.load()).rules}

    def fired(rule_id):
        return {(m.device, m.value) for m in evaluate(store, rules[rule_id], at)}

    assert fired("gpu_lost") == {("pci:0000:b3:00", 1.0), ("pci:0000:91:00", 1.0)}
    assert rules["gpu_lost"].severity == "critical" and rules["gpu_lost"].level == "L4"
    assert fired("gpu_xid_79") == {("pci:0000:91:00", 1.0)}  # the Xid line, counted apart
    assert {device for device, _ in fired("nvswitch_sxid_fatal")} == {"nvswitch0", "nvswitch1", "nvswitch2"}
    assert fired("nvswitch_sxid_nonfatal") == set()  # the capture's SXids are fatal, and one unknown
    assert {device for device, _ in fired("nvswitch_sxid_unknown_severity")} == {"nvswitch2"}


def test_a_gpu_lost_mid_run_is_critical_through_the_module_callback_store_and_rules(tmp_path, tmp_dsn):
    """The real gpu_facts module in ansible-playbook on the H200 capture, the ClickHouse callback, the
    shipped rules. The HGX incident's NVRM lines (the README quotes them with `> `) at the H200's bus."""
    real_log = (REAL / "commands/dmesg_nvrm_lines.txt").read_text()
    sweep(tmp_path, tmp_dsn, real_log)
    incident = [line[2:] for line in HGX_79_SXID.splitlines() if "NVRM" in line]
    at_h200 = "\n".join(line.replace("0000:91:00", "0000:00:06") for line in incident) + "\n"
    sweep(tmp_path, tmp_dsn, real_log + at_h200)
    found = findings(tmp_dsn)
    critical = {(rule, device) for rule, _node, device, severity in found if severity == "critical"}
    assert {("gpu_xid_79", "gpu0"), ("gpu_lost", "gpu0")} <= critical
    assert all(node == NODE for _rule, node, _device, _severity in found)
