"""Rules at every cadence (docs/design.md "Rules"): a cluster sweeps every 2 to 10 minutes with jitter,
not every 60 s. Every shipped rule loads and finds the lab's faults with sweeps every 30 s to 600 s
(the lab's real sweeps, laid out at that cadence); a window shorter than 3 reports stretches to them;
min_samples is a share of the reports; the sweeps' interval never applies to the stream's series; and
a window follows the spacing the series show when the inventory says nothing."""

from __future__ import annotations

import uuid

import pytest
from lab_sweeps import HEALTHY, jittered
from lab_sweeps import STATE_FAULTS as LAB_STATE_FAULTS
from test_telemetry_rules import CASES, GPU0, RULES, stream

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.cadence import Cadence
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, replay_sweeps

STATE_FAULTS = set(LAB_STATE_FAULTS)


@pytest.mark.parametrize("interval", [30, 60, 120, 300, 600])
def test_every_shipped_rule_loads_and_finds_the_labs_faults_with_sweeps_every(tmp_dsn, lab_sweeps, interval):
    catalog = Catalog.load().with_intervals(interval)  # the inventory's stethoscope_sweep_interval
    loaded = load_rules(TOP / "rules", catalog)
    assert loaded.errors == [] and len(loaded.rules) >= 58
    at = now_ms() - 60_000
    with Store(tmp_dsn, f"t_{uuid.uuid4().hex[:8]}") as store:
        store.init_schema()
        replay_sweeps(store, lab_sweeps, jittered(at, interval, 8, seed=interval))
        found = {(f["node_id"], f["rule_id"]) for f in diagnose(store, loaded.rules, at, catalog)}
    assert found >= STATE_FAULTS, sorted(STATE_FAULTS - found)
    assert not [f for f in found if f[0] in HEALTHY]


def test_a_short_window_stretches_to_3_reports_and_min_samples_is_a_share_of_them():
    every_5_min = Catalog.load().with_intervals(300)
    rules = {r.rule_id: r for r in load_rules(TOP / "rules/network/ib_port.yml", every_5_min).rules}
    (port,) = rules["ib_port_not_active"].when.items  # 3m, min_samples 3: every report of 3 at 60 s
    assert (port.written_window_seconds, port.window_seconds, port.min_share) == (180, 900, 1.0)
    assert port.min_samples == 2  # 3 reports in 15 min at 300 s, one of them allowed to be late or lost
    at_60 = {r.rule_id: r for r in load_rules(TOP / "rules/network/ib_port.yml", Catalog.load()).rules}
    (port,) = at_60["ib_port_not_active"].when.items
    assert (port.window_seconds, port.min_samples) == (180, 2)


def test_the_sweep_interval_never_applies_to_the_streams_series():
    every_5_min = Catalog.load().with_intervals(300)
    loaded = load_rules(TOP / "rules/stream", every_5_min)
    assert loaded.errors == [] and loaded.notes == []
    clock = {r.rule_id: r for r in loaded.rules}["stream_gpu_sm_clock_drop_under_load"]
    for condition in clock.when.items:  # 3m at 5 s, 12 of 36 samples: as written
        assert (condition.interval_seconds, condition.window_seconds, condition.min_samples) == (5, 180, 12)


def test_a_stream_rule_fires_on_its_5_second_data_under_an_inventory_that_sweeps_every_5_minutes(store):
    at = now_ms() - 30_000
    every_5_min = Catalog.load().with_intervals(300)
    (rule,) = [
        r
        for r in load_rules(TOP / "rules/stream", every_5_min).rules
        if r.rule_id == "stream_gpu_sm_clock_drop_under_load"
    ]
    firing, _ = CASES["stream_gpu_sm_clock_drop_under_load"]
    stream(store, "bad", *firing, at)
    assert rule == RULES[rule.rule_id]  # the same rule as at the catalog's 60 s
    fitted = Cadence.learn(store, at).fit(rule)
    assert [m.node_id for m in evaluate(store, fitted, at)] == ["bad"]
    assert firing[0] == GPU0


def test_a_window_follows_the_spacing_the_series_show_when_the_inventory_says_nothing(tmp_dsn, lab_sweeps):
    """The catalog says 60 s; the cluster sweeps every 5 minutes and nobody told the inventory: a 3m
    window would hold one sample and a port down in every sweep would never be found."""
    catalog = Catalog.load()
    rules = [r for r in load_rules(TOP / "rules/network/ib_port.yml", catalog).rules]
    at = now_ms() - 60_000
    with Store(tmp_dsn) as store:
        store.init_schema()
        replay_sweeps(store, lab_sweeps, jittered(at, 300, 12, seed=7))
        cadence = Cadence.learn(store, at)
        assert 240 <= cadence.learned[("ib_port_state", False)] <= 360
        (port,) = next(r for r in cadence.fit_all(rules) if r.rule_id == "ib_port_not_active").when.items
        assert port.window_seconds >= 720 and port.cadence_seconds >= 240
        found = {(f["node_id"], f["rule_id"]) for f in diagnose(store, rules, at, catalog)}
    assert ("node08", "ib_port_not_active") in found
