"""Rule loading and validation: the seed loads unchanged; every problem is file:line, field, message."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.rules import Condition, Group, load_rules, parse_duration

from conftest import FIXTURES, TOP

CATALOG = Catalog.load()


def test_the_seed_rule_loads_unchanged():
    result = load_rules(FIXTURES / "rules/seed_nvlink_physical_error.yml", CATALOG)
    assert result.errors == []
    (rule,) = result.rules
    assert (rule.rule_id, rule.severity, rule.line) == ("nvlink_physical_error", "critical", 1)
    assert rule.when == Group(
        "all",
        (
            Condition(
                "nvlink_error_rate_percent",
                ">",
                0.001,
                300,
                better="lower",
                written_window_seconds=300,
                cadence_seconds=60,
            ),
            Condition(
                "gpu_temperature_celsius",
                "<",
                70.0,
                300,
                better="lower",
                written_window_seconds=300,
                cadence_seconds=60,
            ),
        ),
    )
    assert [a.type for a in rule.actions] == ["alert", "api_call", "log"]


@pytest.mark.parametrize(
    "text, duration",
    [
        *(("30s", 30), ("5m", 300), ("1h", 3600), ("7d", 604800), ("5 min", None)),
        *(("1.5h", 5400), ("1w", 604800), ("300", 300), ("1.5s", None), ("-5m", None)),
    ],
)
def test_durations(text, duration):
    assert parse_duration(text) == duration


def write(tmp_path, text):
    path = tmp_path / "rules.yml"
    path.write_text(textwrap.dedent(text))
    return path


def test_each_problem_names_file_line_and_field(tmp_path):
    path = write(
        tmp_path,
        """\
        - rule_id: bad_one
          description: several mistakes
          severity: urgent
          trigger:
            - metric: gpu_made_up_celsius
              operator: "=>"
              threshold: 70
              window: 5m
            - metric: gpu_temperature_celsius
              operator: ">"
              threshold: 90
              window: 1m
          action:
            - {type: page, message: "x"}
            - {type: log, message: "{{ node_id "}
        - rule_id: nested_ok
          description: AND/OR nesting
          severity: warning
          when:
            any:
              - {metric: gpu_thermal_violation, operator: ">", threshold: 0, window: 10m}
              - all:
                  - {metric: gpu_throttle_reasons_active, operator: has_bits, threshold: 96, window: 10m}
                  - {metric: gpu_temperature_celsius, operator: ">=", threshold: 85, window: 10m,
                     aggregate: max}
        """,
    )
    result = load_rules(path, CATALOG)
    problems = sorted((e.line, e.field, e.message.split(":")[0].split(" (")[0]) for e in result.errors)
    assert problems == [
        (3, "severity", "one of info, warning, critical; got 'urgent'"),
        (5, "metric", "unknown metric 'gpu_made_up_celsius'"),
        (6, "operator", "one of > >= < <= == != has_bits; got '=>'"),
        (14, "type", "unknown action type 'page'"),
        (15, "message", "template syntax error"),
    ]
    assert str(result.errors[0]).startswith(f"{path}:")
    # a window shorter than 3 reports is no error: it stretches to them, and says so in a note
    (note,) = result.notes
    assert (note.line, note.field) == (12, "window")
    assert "1m is shorter than 3 reports of gpu_temperature_celsius at 60 s: it reads 3m" in note.message
    assert [r.rule_id for r in result.rules] == ["nested_ok"]  # the bad rule is rejected, the good one kept
    assert result.rules[0].when.mode == "any" and isinstance(result.rules[0].when.items[1], Group)


def test_duplicate_ids_and_broken_yaml(tmp_path):
    (tmp_path / "a.yml").write_text(
        "rule_id: x\ndescription: d\nseverity: info\n"
        "trigger: [{metric: net_mtu, operator: '<', threshold: 4000, window: 5m}]\n"
    )
    (tmp_path / "b.yml").write_text((tmp_path / "a.yml").read_text())
    (tmp_path / "c.yml").write_text("rule_id: [unclosed\n")
    result = load_rules(tmp_path, CATALOG)
    assert len(result.rules) == 1 and result.files == 3
    messages = sorted(str(e) for e in result.errors)
    assert any("b.yml:1: rule_id: 'x' is already defined in" in m for m in messages)
    assert any("c.yml:" in m and ": yaml:" in m for m in messages)


def test_rules_check_cli(tmp_path):
    good = subprocess.run(
        [
            sys.executable,
            "-m",
            "stethoscope.cli",
            "rules",
            "check",
            str(FIXTURES / "rules/seed_nvlink_physical_error.yml"),
        ],
        capture_output=True,
        text=True,
        cwd=TOP,
        check=False,
    )
    assert good.returncode == 0 and good.stdout.startswith("1 rules valid in 1 files; 0 problems")
    bad = write(
        tmp_path,
        "rule_id: r\ndescription: d\nseverity: info\n"
        "trigger: [{metric: nope, operator: '>', threshold: 1, window: 5m}]\n",
    )
    result = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "rules", "check", str(bad)],
        capture_output=True,
        text=True,
        cwd=TOP,
        check=False,
    )
    assert result.returncode == 2 and f"{bad}:4: metric: unknown metric 'nope'" in result.stderr
    assert "Traceback" not in result.stderr


def test_baseline_correlate_message_and_playbook_fields_are_validated(tmp_path):
    path = write(
        tmp_path,
        """\
        - rule_id: bad_extensions
          description: misused extensions
          severity: warning
          message: "{{ node_id"
          correlate: {by: pdu}
          trigger:
            - {metric: bench_gemm_tflops, operator: ">", threshold: 10, window: 1d, baseline: class}
            - {metric: bench_gemm_tflops, operator: ">", threshold: 10, window: 1d, baseline: fleet,
               history: 7d}
            - {metric: net_mtu, operator: ">", threshold: 1, window: 5m, deviation: sigma}
          action:
            - {type: playbook, playbook: ../../etc/evil.yml}
            - {type: playbook, playbook: remediate/drain.yml, limit: all}
        """,
    )
    result = load_rules(path, CATALOG)
    problems = sorted((e.line, e.field) for e in result.errors)
    assert problems == [
        (4, "message"),
        (5, "correlate"),
        (7, "baseline"),
        (9, "history"),
        (10, "baseline"),
        (12, "playbook"),
        (13, "limit"),
    ]
    assert result.rules == []


def test_every_shipped_playbook_action_exists():
    playbooks = {
        dict(action.params)["playbook"]
        for rule in load_rules(TOP / "rules", CATALOG).rules
        for action in rule.actions
        if action.type == "playbook"
    }
    assert playbooks == {"remediate/drain.yml", "remediate/evidence.yml", "remediate/ticket.yml"}
    assert all((TOP / "playbooks" / p).is_file() for p in playbooks)


def test_rules_check_with_an_inventory_that_sweeps_every_five_minutes_stretches_the_window(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  vars:\n    stethoscope_sweep_interval: 300\n  hosts:\n    node01:\n")
    rule = write(
        tmp_path,
        "rule_id: r\ndescription: d\nseverity: info\n"
        "trigger: [{metric: gpu_temperature_celsius, operator: '>', threshold: 80, window: 5m,\n"
        "           min_samples: 5}]\n",
    )
    command = [sys.executable, "-m", "stethoscope.cli", "rules", "check", str(rule)]
    fast = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
    assert fast.returncode == 0 and "note" not in fast.stdout + fast.stderr
    slow = subprocess.run(
        [*command, "--inventory", str(inventory)], capture_output=True, text=True, cwd=TOP, check=False
    )
    assert slow.returncode == 0, slow.stderr
    assert (
        f"{rule}:4: window: note: 5m is shorter than 3 reports of gpu_temperature_celsius at 300 s: "
        "it reads 15m (3 x 300 s)" in slow.stdout
    )
    assert "1 rules valid in 1 files; 0 problems; 1 windows stretched to their cadence" in slow.stdout
    (loaded,) = load_rules(rule, CATALOG.with_intervals(300)).rules
    (condition,) = loaded.when.items
    # 5 of 5 expected reports as written: 2 of the 3 a 15-minute window holds at 300 s (one may be late)
    assert (condition.window_seconds, condition.min_samples, condition.min_share) == (900, 2, 1.0)


def test_family_is_loaded_and_a_bad_family_names_its_line(tmp_path):
    path = write(
        tmp_path,
        """\
        - rule_id: climbing
          description: early warning
          severity: warning
          family: ssd_reallocated
          trigger: [{metric: net_mtu, operator: "<", threshold: 4000, window: 5m}]
        - rule_id: no_family
          description: alone
          severity: info
          trigger: [{metric: net_mtu, operator: "<", threshold: 4000, window: 5m}]
        - rule_id: bad_family
          description: a list is not a name
          severity: info
          family: [a, b]
          trigger: [{metric: net_mtu, operator: "<", threshold: 4000, window: 5m}]
        """,
    )
    result = load_rules(path, CATALOG)
    assert {r.rule_id: r.family for r in result.rules} == {"climbing": "ssd_reallocated", "no_family": None}
    assert [(e.line, e.field) for e in result.errors] == [(13, "family")]


def test_rules_check_rejects_an_aggregate_the_metric_kind_does_not_allow(tmp_path):
    path = write(
        tmp_path,
        """\
        - rule_id: counter_averaged
          description: the average of a cumulative count means nothing
          severity: warning
          trigger:
            - {metric: ib_symbol_errors_total, operator: ">", threshold: 10, window: 15m, aggregate: avg}
        - rule_id: gauge_differenced
          description: a temperature does not increase by events
          severity: warning
          trigger:
            - {metric: gpu_temperature_celsius, operator: ">", threshold: 10, window: 15m, aggregate: delta}
        - rule_id: events_by_default
          description: an events metric defaults to delta, which it allows
          severity: warning
          trigger:
            - {metric: gpu_xid_errors_total, operator: ">", threshold: 0, window: 15m}
        """,
    )
    result = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "rules", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=TOP,
        check=False,
    )
    assert result.returncode == 2
    assert f"{path}:5: aggregate: avg does not apply to ib_symbol_errors_total, a counter " in result.stderr
    assert "(a counter allows delta, last, rate, slope, growth_percent)" in result.stderr
    assert f"{path}:10: aggregate: delta does not apply to gpu_temperature_celsius, a gauge " in result.stderr
    gauge_allows = "(a gauge allows avg, max, min, last, p99, stddev, cv, slope, rising_fraction, any)"
    assert gauge_allows in result.stderr
    loaded = load_rules(path, CATALOG)
    assert [r.rule_id for r in loaded.rules] == ["events_by_default"]
    (condition,) = loaded.rules[0].when.items
    assert (condition.aggregate, condition.kind) == ("delta", "events")
