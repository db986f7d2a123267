"""Faults that come and go: `aggregate: any` finds a state bit set in any sample of the window and says
how often, where `last` sees it only when an evaluation lands inside a spell; clock events named as
NVML documents them (power brake, thermal, or a HW slowdown NVML cannot attribute).

The samples are the real H200 capture under load (SW power cap 0x4 set) with the clock-event reasons
of each sweep marked Active, read by the real parser and stored as the callback stores a sweep."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import replace

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import (
    gpu_metrics,
    parse_query_xml,
)
from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.rules import Group, load_rules
from stethoscope.store.result_rows import rows_from_result
from stethoscope.timeutil import now_ms

from conftest import TOP, fixture_text

CATALOG = Catalog.load()
LOADED = load_rules(TOP / "rules", CATALOG)
RULES = {rule.rule_id: rule for rule in LOADED.rules}
THROTTLE_RULES = ("gpu_thermal_throttling", "gpu_hw_power_brake", "gpu_hw_slowdown")
AT = now_ms() - 30_000
SWEEP = 60_000
UNDER_LOAD = "real/h200-vm/under-load/nvidia-smi_-q_-x_under_load.xml"
# a power brake as nvidia-smi reported it on 8 x H100 (public capture): HW Slowdown and HW Power Brake
# Slowdown Active on every GPU; the text report's names, as the XML report's tags name them
BRAKED_H100 = "public/nvidia-smi/q_text_8xH100-80GB-HBM3_535.161.08.txt"
TEXT_REASONS = {
    "Idle": "gpu_idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clocks_setting",
}


def captured_reasons(path: str) -> tuple[str, ...]:
    """The clock-event reasons Active for the first GPU of a `nvidia-smi -q` text capture."""
    lines = fixture_text(path).splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "Clocks Event Reasons")
    active = []
    for line in lines[start + 1 :]:
        name, _, state = (part.strip() for part in line.partition(":"))
        if name not in TEXT_REASONS:
            break
        if state == "Active":
            active.append(TEXT_REASONS[name])
    return tuple(active)


HEALTHY = ()  # under load at its power cap: sw_power_cap alone, as captured
POWER_BRAKE = captured_reasons(BRAKED_H100)
HW_THERMAL = ("hw_slowdown", "hw_thermal_slowdown")
HW_SLOWDOWN_ALONE = ("hw_slowdown",)


def test_the_captured_power_brake_sets_hw_slowdown_with_it():
    # why 0x8 is no thermal bit: NVML reports a power brake as HW slowdown too
    assert POWER_BRAKE == ("hw_slowdown", "hw_power_brake_slowdown")


def sweep_xml(active: tuple[str, ...]) -> str:
    """The capture with these clock-event reasons Active (the tags as nvidia-smi -q -x names them)."""
    xml = fixture_text(UNDER_LOAD)
    for reason in active:
        tag = f"clocks_event_reason_{reason}"
        xml, count = re.subn(rf"<{tag}>[^<]*</{tag}>", f"<{tag}>Active</{tag}>", xml, count=1)
        assert count == 1, tag
    return xml


def store_sweeps(store, node: str, sweeps: list[tuple[str, ...]]) -> None:
    """One sweep a minute, the last at AT: each parsed from the capture and stored as the callback does."""
    for index, active in enumerate(sweeps):
        rows = gpu_metrics(parse_query_xml(sweep_xml(active))["gpus"])
        at = AT - (len(sweeps) - 1 - index) * SWEEP
        store.insert_metrics(rows_from_result(node, {"stethoscope_metrics": rows}, "sweep", at).metrics)


def throttle_findings(store) -> dict[str, dict]:
    return {
        f["rule_id"]: f for f in diagnose(store, LOADED.rules, AT, CATALOG) if f["rule_id"] in THROTTLE_RULES
    }


def as_last(rule):
    """The rule as it was written before `any`: its conditions read the window's last sample."""
    (condition,) = rule.conditions
    return replace(rule, when=Group("all", (replace(condition, aggregate="last", min_matches=1),)))


# a power brake asserted in 2 of 10 sweeps, not in the last: between two spells of it
INTERMITTENT_BRAKE = [HEALTHY] * 3 + [POWER_BRAKE] + [HEALTHY] * 3 + [POWER_BRAKE] + [HEALTHY] * 2


def test_an_intermittent_power_brake_is_found_and_told_how_often(store):
    store_sweeps(store, "node02", INTERMITTENT_BRAKE)
    brake = throttle_findings(store)["gpu_hw_power_brake"]
    assert (brake["node_id"], brake["device"]) == ("node02", "gpu0")
    assert "HW power brake asserted in 2 of 10 samples" in brake["message"]
    evidence = json.loads(brake["evidence"])
    assert evidence["gpu_throttle_reasons_active.matches"] == 2
    assert evidence["gpu_throttle_reasons_active.samples"] == 10
    assert evidence["gpu_throttle_reasons_active"] == 0x80 | 0x8 | 0x4  # the bits of the matching samples


def test_the_same_power_brake_read_at_the_last_sample_is_missed(store):
    store_sweeps(store, "node02", INTERMITTENT_BRAKE)
    assert evaluate(store, as_last(RULES["gpu_hw_power_brake"]), AT) == []
    assert [m.node_id for m in evaluate(store, RULES["gpu_hw_power_brake"], AT)] == ["node02"]


@pytest.mark.parametrize(
    "active, named",
    [
        (HW_SLOWDOWN_ALONE, {"gpu_hw_slowdown"}),
        (HW_THERMAL, {"gpu_thermal_throttling"}),
        (POWER_BRAKE, {"gpu_hw_power_brake"}),
        (("sw_thermal_slowdown",), {"gpu_thermal_throttling"}),
        # overheating as it usually shows: SW thermal with HW slowdown (0x28) is thermal, not ambiguous
        (("hw_slowdown", "sw_thermal_slowdown"), {"gpu_thermal_throttling"}),
        (HEALTHY, set()),
    ],
)
def test_clock_events_are_named_as_nvml_documents_them(store, active, named):
    store_sweeps(store, "node03", [active] * 5)
    findings = throttle_findings(store)
    assert set(findings) == named
    if named == {"gpu_hw_slowdown"}:
        message = findings["gpu_hw_slowdown"]["message"]
        assert "thermal or power brake" in message and "NVML cannot say which" in message
        assert "5 of 5 samples" in message


def test_a_hw_slowdown_beside_its_cause_in_another_sample_is_not_called_ambiguous(store):
    # the same spell seen as 0x8|0x40 in one sweep and 0x8 alone in the next: thermal, and the 0x8-only
    # sample counts once, below the 2 the ambiguous rule asks for (a clock change may report it alone)
    store_sweeps(store, "node03", [HEALTHY] * 3 + [HW_THERMAL, HW_SLOWDOWN_ALONE])
    assert set(throttle_findings(store)) == {"gpu_thermal_throttling"}


def load_one(tmp_path, condition: str):
    path = tmp_path / "rule.yml"
    path.write_text(
        textwrap.dedent(
            f"""\
            rule_id: r
            description: test
            severity: warning
            trigger:
              - {condition}
            """
        )
    )
    return load_rules(path, CATALOG), path


def test_any_on_a_counter_is_refused_with_its_file_and_line(tmp_path):
    result, path = load_one(
        tmp_path, "{metric: gpu_xid_errors_total, operator: '>', threshold: 0, window: 5m, aggregate: any}"
    )
    (error,) = result.errors
    assert (error.file, error.line, error.field) == (str(path), 5, "aggregate")
    assert error.message.startswith("any does not apply to gpu_xid_errors_total")
    assert "delta counts every event in the window" in error.message


@pytest.mark.parametrize(
    "condition, field, words",
    [
        (
            "{metric: gpu_throttle_reasons_active, operator: has_bits, threshold: 8, window: 5m, "
            "min_matches: 2}",
            "min_matches",
            "aggregate: any",
        ),
        (
            "{metric: gpu_throttle_reasons_active, operator: '>', threshold: 8, window: 5m, "
            "without_bits: 64}",
            "without_bits",
            "has_bits",
        ),
        (
            "{metric: gpu_temperature_celsius, operator: '>', threshold: 5, window: 5m, aggregate: any, "
            "baseline: node}",
            "aggregate",
            "baseline",
        ),
        (
            "{metric: gpu_throttle_reasons_active, operator: has_bits, threshold: 8, window: 5m, "
            "aggregate: any, min_matches: 0}",
            "min_matches",
            "positive integer",
        ),
    ],
)
def test_the_loader_refuses_what_any_cannot_mean(tmp_path, condition, field, words):
    result, path = load_one(tmp_path, condition)
    assert [(e.file, e.line, e.field) for e in result.errors] == [(str(path), 5, field)]
    assert words in result.errors[0].message


def test_any_on_a_comparison_matches_when_one_sample_passes(store, tmp_path):
    result, _path = load_one(
        tmp_path,
        "{metric: gpu_temperature_celsius, operator: '>=', threshold: 90, window: 10m, aggregate: any}",
    )
    (rule,) = result.rules
    temperatures = [70, 71, 93, 70, 91, 70]
    for index, value in enumerate(temperatures):
        rows = [{"name": "gpu_temperature_celsius", "device": "gpu0", "value": value, "labels": {}}]
        at = AT - (len(temperatures) - 1 - index) * SWEEP
        store.insert_metrics(rows_from_result("node07", {"stethoscope_metrics": rows}, "sweep", at).metrics)
    (match,) = evaluate(store, rule, AT)
    assert match.value == 93  # the worst passing sample
    assert match.values["gpu_temperature_celsius.matches"] == 2
    assert match.values["gpu_temperature_celsius.samples"] == 6
    assert evaluate(store, as_last(rule), AT) == []


def test_the_streams_or_of_every_gpus_bits_is_no_second_finding(store):
    """The push agent's node part ORs the GPUs' clock events into one series (device `node`, label
    `source=stream`): the sweeps' per-GPU samples are what the rules read, one finding per GPU."""
    from stethoscope.store.batch import MetricColumns

    store_sweeps(store, "node02", [POWER_BRAKE] * 3)
    stream = MetricColumns()
    for step in range(12):
        labels = {"source": "stream", "agg": "or"}
        stream.append("node02", "gpu_throttle_reasons_active", "node", labels, 0x80 | 0x8, AT - step * 5_000)
    store.insert_metrics(stream)
    brake = [(m.node_id, m.device) for m in evaluate(store, RULES["gpu_hw_power_brake"], AT)]
    assert brake == [("node02", "gpu0")]
