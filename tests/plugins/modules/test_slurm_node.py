"""Slurm drain and resume: the parser on real `scontrol -o show node` output (Slurm 22.05), and the
slurm_node module against a real slurmctld: drain, idempotence, check mode, diff, and refusing to
resume a drain that is not the one given."""

from __future__ import annotations

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.slurm import parse_show_node

from conftest import fake_tools, fixture_text, run_module

REASON = "stethoscope: ssd_reallocated_sectors 1a2b3c4d5e6f"


@pytest.mark.parametrize(
    "fixture, state, flags, drained, reason",
    [
        ("drained", "DOWN", ["DRAIN", "NOT_RESPONDING"], True, REASON),
        ("drained_by_a_human", "UNKNOWN", ["DRAIN", "NOT_RESPONDING"], True, "maintenance by ops"),
        ("never_responded", "UNKNOWN", ["NOT_RESPONDING"], False, ""),
        ("resumed", "IDLE", ["NOT_RESPONDING"], False, ""),
    ],
)
def test_parse_show_node(fixture, state, flags, drained, reason):
    node = parse_show_node(fixture_text(f"real/slurm/scontrol_-o_show_node_{fixture}.txt"))
    assert (node["state"], node["flags"], node["drained"], node["reason"]) == (state, flags, drained, reason)


@pytest.mark.parametrize(
    "text", ["", "Node node99 not found\n", "NodeName=a\nNodeName=b\n", "NodeName=a Arch=x\n"]
)
def test_parse_show_node_rejects_garbage(text):
    with pytest.raises(ParseError, match="scontrol -o show node"):
        parse_show_node(text)


def _module(tmp_path, monkeypatch, slurm, check=False, **args):
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    return run_module(tmp_path, "slurm_node", args, bindir, check=check)


def test_drain_is_idempotent_and_check_mode_writes_nothing(tmp_path, monkeypatch, slurm):
    checked = _module(tmp_path, monkeypatch, slurm, check=True, name="node05", state="drained", reason=REASON)
    assert checked["changed"] and "DRAIN" not in slurm.node("node05")["state"]
    drained = _module(tmp_path, monkeypatch, slurm, name="node05", state="drained", reason=REASON)
    assert drained["changed"] and "DRAIN" in slurm.node("node05")["state"]
    assert slurm.node("node05")["reason"].startswith(REASON)
    again = _module(tmp_path, monkeypatch, slurm, name="node05", state="drained", reason=REASON)
    assert not again["changed"]
    resumed = _module(tmp_path, monkeypatch, slurm, name="node05", state="resumed", reason=REASON)
    assert resumed["changed"] and "DRAIN" not in slurm.node("node05")["state"]
    assert slurm.node("node05")["reason"] == ""


def test_a_drain_is_never_reissued_over_another_reason(tmp_path, monkeypatch, slurm):
    first = _module(tmp_path, monkeypatch, slurm, name="node04", state="drained", reason=REASON)
    assert first["changed"]
    other = "stethoscope: ssd_reallocated_sectors 999999999999"
    again = _module(tmp_path, monkeypatch, slurm, name="node04", state="drained", reason=other)
    assert not again["changed"] and not again["failed"] and "kept" in again["msg"]
    assert slurm.node("node04")["reason"].startswith(REASON)


def test_a_drain_stethoscope_does_not_hold_is_never_resumed(tmp_path, monkeypatch, slurm):
    slurm.scontrol("update", "NodeName=node06", "State=DRAIN", "Reason=maintenance by ops")
    refused = _module(tmp_path, monkeypatch, slurm, name="node06", state="resumed", reason=REASON)
    assert refused["failed"] and "not resuming" in refused["msg"]
    assert "DRAIN" in slurm.node("node06")["state"] and slurm.node("node06")["reason"].startswith(
        "maintenance"
    )


def test_invalid_names_never_reach_scontrol(tmp_path, monkeypatch, slurm):
    bad = _module(tmp_path, monkeypatch, slurm, name="node01;reboot", state="drained", reason=REASON)
    assert bad["failed"] and "not a valid node name" in bad["msg"]


def test_garbage_from_scontrol_is_a_clear_failure(tmp_path):
    bindir = tmp_path / "bin"
    fake_tools(
        bindir,
        tmp_path / "calls.log",
        {"scontrol": "echo 'slurm_load_node error: Zero Bytes were transmitted'"},
    )
    result = run_module(
        tmp_path, "slurm_node", {"name": "node01", "state": "drained", "reason": REASON}, bindir
    )
    assert result["failed"] and result["msg"].startswith("scontrol -o show node: expected one line")
    assert "update" not in (tmp_path / "calls.log").read_text()
