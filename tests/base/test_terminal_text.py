"""Node-controlled text reaches the operator's terminal as visible escapes: a device, a
node name or a message holding an escape sequence, a newline or a bidi override printed raw could
clear the screen, forge a line of output or reverse what follows it. JSON output keeps the data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stethoscope.remediation.ledger import Ledger, note_row
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.terminal import terminal_safe
from stethoscope.timeutil import now_ms

from conftest import TOP

# clear the screen, end the line and start a forged one, reverse the rest of the line
DEVICE = "gpu0\x1b[2J\nFORGED device\u202e"
NODE = "node07\x1b]0;pwned\x07\u2066"
HOT_RULE = """
- rule_id: hot
  description: hot GPU (test)
  severity: critical
  message: "{{ node_id }} {{ device }} is hot"
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m}
"""
RAW = ("\x1b", "\x07", "\u202e", "\u2066")


@pytest.fixture
def hostile_store(tmp_path, tmp_dsn):
    """A store with a hot GPU whose device (and another node's name) are hostile, and an incident
    about it with an action whose reason quotes it."""
    at = now_ms()
    with Store(tmp_dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for ago in (120_000, 60_000, 1_000):
            batch.append("node01", "gpu_temperature_celsius", DEVICE, {}, 85.0, at - ago)
            batch.append(NODE, "gpu_temperature_celsius", "gpu1", {}, 40.0, at - ago)
        store.insert_metrics(batch)
        finding = {
            "finding_id": "f1", "txn_id": "t1", "rule_id": "hot", "node_id": "node01", "device": DEVICE,
            "severity": "critical", "confidence": 1.0, "level": "L3", "message": f"node01 {DEVICE} is hot",
            "evidence": "{}", "first_seen_ms": at - 60_000,
        }  # fmt: skip
        ledger = Ledger(store)
        ledger.write_findings([(finding, "open", 1, at)])
        ledger.write_action(
            note_row("t1", "needs_person", "node01", {"reason": f"{DEVICE} says no"}, "f1"), 1
        )
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "hot.yml").write_text(HOT_RULE)
    return tmp_dsn, tmp_path / "rules"


def stethoscope(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, *args],
        cwd=TOP,
        capture_output=True,
        text=True,
        check=False,
    )


def assert_shown_safely(output: str, *expected: str) -> None:
    assert not [c for c in RAW if c in output], output
    assert not [line for line in output.splitlines() if line.startswith("FORGED")], output
    for text in expected:
        assert terminal_safe(text) in output, output


def test_hostile_device_and_node_names_print_as_visible_escapes(hostile_store):
    """Regression: the device's escape sequence, newline and U+202E reached the terminal raw."""
    dsn, rules = hostile_store
    diagnosed = stethoscope(dsn, "diagnose", "--rules", str(rules))
    assert diagnosed.returncode == 1, diagnosed.stderr
    assert_shown_safely(diagnosed.stdout, DEVICE)
    summary = stethoscope(dsn, "summary")  # the shipped rules: the hostile node has a row
    assert summary.returncode == 0, summary.stderr
    assert_shown_safely(summary.stdout, NODE)
    top = stethoscope(dsn, "top", "gpu_temperature_celsius")
    assert top.returncode == 0, top.stderr
    assert_shown_safely(top.stdout, DEVICE, NODE)
    board = stethoscope(dsn, "report", "--no-model")
    assert board.returncode == 0, board.stderr
    assert_shown_safely(board.stdout, NODE)


def test_incidents_and_actions_print_hostile_text_as_visible_escapes(hostile_store):
    dsn, _ = hostile_store
    listed = stethoscope(dsn, "incidents")
    assert listed.returncode == 0, listed.stderr
    assert_shown_safely(listed.stdout, DEVICE)
    shown = stethoscope(dsn, "incidents", "show", "t1")
    assert shown.returncode == 0, shown.stderr
    assert_shown_safely(shown.stdout, DEVICE, f"node01 {DEVICE} is hot", f"{DEVICE} says no")
    actions = stethoscope(dsn, "actions")
    assert actions.returncode == 0, actions.stderr
    assert_shown_safely(actions.stdout, f"{DEVICE} says no")


def test_json_output_keeps_the_data_as_it_is(hostile_store):
    dsn, rules = hostile_store
    diagnosed = stethoscope(dsn, "diagnose", "--json", "--rules", str(rules))
    assert DEVICE in {finding["device"] for finding in json.loads(diagnosed.stdout)}
    listed = stethoscope(dsn, "incidents", "--json")
    assert json.loads(listed.stdout)[0]["device"] == DEVICE


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("gpu0\x1b[2J", "gpu0\\x1b[2J"),
        ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),
        ("x\x7f\x9by", "x\\x7f\\x9by"),
        ("abc\u202edef\u2066\u200f\u061c", "abc\\u202edef\\u2066\\u200f\\u061c"),
        ("line\u2028sep", "line\\u2028sep"),
        ("日本語 σ ± é", "日本語 σ ± é"),  # printable text stays as it is
    ],
)
def test_terminal_safe_escapes_controls_and_bidi_and_nothing_else(text, shown):
    assert terminal_safe(text) == shown


def test_aligned_columns_fit_their_widest_cell_and_stay_terminal_safe():
    from stethoscope.terminal import aligned

    lines = aligned([["ID", "DEVICE", "RULES"], ["t1", "0000:00:06.0", "a, b"], ["t22", "\x1b[2J", "c"]])
    assert lines == ["ID   DEVICE        RULES", "t1   0000:00:06.0  a, b", "t22  \\x1b[2J       c"]
