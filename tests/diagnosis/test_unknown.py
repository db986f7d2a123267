"""UNKNOWN: a series that stops arriving for 3 of its intervals (the declared one or the spacing it has
shown, whichever is longer), a node that stops altogether, the inventory's nodes that say nothing or
that a sweep could not reach, and the fleet going quiet at once; never a metric the node never had, a
training job that ended, or a benchmark's one-off rows."""

from __future__ import annotations

import json
import subprocess
import sys

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.unknown import (
    DEVICE_RULE,
    FLEET_NODE,
    FLEET_RULE,
    NODE_RULE,
    UNREACHABLE_RULE,
    Fleet,
    silences,
    silent_series,
)
from stethoscope.inventory import Host
from stethoscope.remediation.cycle import Cycles
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

MINUTE = 60_000
HOUR = 60 * MINUTE
AT = now_ms()
SWEEP = [("gpu_temperature_celsius", "gpu0"), ("ib_port_state", "mlx5_0/1")]
SMART = [("smart_reallocated_sector_ct", "sda"), ("smart_health_passed", "sda")]


def sweeps(store, nodes, series, *, every_s=60, since_min=120.0, until_min=1.0, labels=None):
    """What a sweep every `every_s` seconds stores from `since_min` to `until_min` minutes before AT:
    every series of one sweep at the sweep's time, as the callback writes them."""
    batch = MetricColumns()
    for node in [nodes] if isinstance(nodes, str) else nodes:
        at = AT - since_min * MINUTE
        while at <= AT - until_min * MINUTE:
            for metric, device in series:
                batch.append(node, metric, device, labels or {}, 1.0, int(at))
            at += every_s * 1000
    store.insert_metrics(batch)


def fleet_of(*names):
    return Fleet(tuple(Host(name, name, rack="r1", switch="leaf1") for name in names))


def watched(store, at, catalog, fleet):
    """The findings of one `watch` cycle without rules: it records the inventory's hosts it first
    sees, as serve's do (a one-shot `diagnose` only looks)."""
    cycles = Cycles(store.dsn, store.database, catalog, fleet=fleet, long_running=True)
    return cycles.run([], at, store=store).findings


def where(silence):
    """The device a silence names: a node's unknown.device lists its silent devices."""
    return silence.device or ",".join(silence.devices)


def keys(found):
    return {(s.rule_id, s.node_id, where(s)) for s in found}


def test_a_metric_that_stops_is_unknown_and_a_silent_node_is_one_finding(store):
    sweeps(store, "healthy", SWEEP)
    sweeps(store, "lost_gpu", SWEEP)
    sweeps(store, "lost_gpu", [("gpu_temperature_celsius", "gpu1")], until_min=5)  # 5 min > 3 x 60 s
    sweeps(store, "silent", SWEEP, until_min=10)
    sweeps(store, "healthy", [("train_step_time_ms", "node")], until_min=20)  # the job ended
    sweeps(store, "healthy", [("cpu_governor_performance", "node")], until_min=30, labels={"phase": "bench"})
    sweeps(store, "silent", [("bench_gemm_tflops", "gpu0")], since_min=1)  # a benchmark is no sign of life
    sweeps(store, "healthy", [("gpu_power_watts", "gpu0")], since_min=27 * 60, until_min=26 * 60)
    found = {(s.rule_id, s.node_id, where(s)): s for s in silences(store, Catalog.load(), AT)}
    assert set(found) == {(DEVICE_RULE, "lost_gpu", "gpu1"), (NODE_RULE, "silent", "")}
    assert found[(DEVICE_RULE, "lost_gpu", "gpu1")].metrics == ["gpu_temperature_celsius"]
    assert sorted(found[(NODE_RULE, "silent", "")].metrics) == ["gpu_temperature_celsius", "ib_port_state"]
    assert found[(NODE_RULE, "silent", "")].last_seen_ms == AT - 10 * MINUTE


def test_the_inventory_sweep_interval_moves_the_unknown_line(store):
    sweeps(store, "n1", SWEEP, until_min=9)  # swept every 5 min by that inventory: 9 min is fine
    assert keys(silences(store, Catalog.load(), AT)) == {(NODE_RULE, "n1", "")}
    assert silences(store, Catalog.load().with_intervals(300), AT) == []


def test_smart_read_every_10_minutes_is_not_unknown_after_3_sweep_intervals(store):
    sweeps(store, "n1", SWEEP, since_min=6 * 60)
    sweeps(store, "n1", SMART, every_s=600, since_min=6 * 60, until_min=8)  # last read 8 min ago
    assert silences(store, Catalog.load(), AT) == []
    per_hour = store.query(
        f"SELECT sum(samples) FROM {store.database}.metrics_hourly WHERE node_id = 'n1' "
        "AND metric_name = 'smart_health_passed' GROUP BY hour ORDER BY hour"
    )
    assert [n for (n,) in per_hour][1:-1] == [6] * (len(per_hour) - 2)  # whole hours: 6 a hour


def test_an_hourly_series_with_one_jittered_pair_is_not_unknown_after_3_minutes(store):
    sweeps(store, "n1", SWEEP, since_min=12 * 60)
    sweeps(store, "n1", SMART, every_s=3600, since_min=12 * 60 + 50, until_min=50)
    sweeps(store, "n1", SMART, since_min=6 * 60 + 50 - 1 / 3, until_min=6 * 60 + 50 - 1 / 3)  # 20 s late
    assert silences(store, Catalog.load(), AT) == []


def test_a_series_silent_for_3_of_its_learned_intervals_is_unknown(store):
    sweeps(store, "n1", SWEEP, since_min=6 * 60, until_min=-40)
    sweeps(store, "n1", SMART, every_s=600, since_min=6 * 60, until_min=25)
    catalog = Catalog.load()
    assert silences(store, catalog, AT) == []  # 25 min: not yet 3 x 10 min
    found = silences(store, catalog, AT + 10 * MINUTE)  # 35 min
    assert keys(found) == {(DEVICE_RULE, "n1", "sda")}
    assert sorted(found[0].metrics) == ["smart_health_passed", "smart_reallocated_sector_ct"]


def test_an_inventory_node_that_never_reported_is_unknown_node(store):
    names = [f"n{i:02d}" for i in range(20)]
    sweeps(store, names[1:], SWEEP)
    fleet = fleet_of(*names)
    catalog = Catalog.load()
    assert watched(store, AT - 30 * MINUTE, catalog, fleet) == []  # first sight: its grace
    (finding,) = watched(store, AT, catalog, fleet)
    assert (finding["rule_id"], finding["node_id"], finding["severity"]) == (NODE_RULE, "n00", "unknown")
    assert json.loads(finding["evidence"])["last_seen"] is None
    assert "nothing reported ever" in finding["message"]
    assert silences(store, catalog, AT) == []  # without an inventory nobody knows it should report


def test_a_node_silent_for_more_than_24_h_stays_unknown_node_until_it_leaves_the_inventory(store):
    names = [f"n{i:02d}" for i in range(20)]
    sweeps(store, names[1:], SWEEP)
    sweeps(store, "n00", SWEEP, since_min=30 * 60, until_min=26 * 60)
    catalog = Catalog.load()
    (silence,) = silences(store, catalog, AT, fleet_of(*names))
    assert (silence.rule_id, silence.node_id, silence.last_seen_ms) == (NODE_RULE, "n00", AT - 26 * HOUR)
    assert silences(store, catalog, AT, fleet_of(*names[1:])) == []  # it left the inventory


def test_a_node_new_to_the_inventory_is_nothing_within_its_grace(store):
    names = [f"n{i:02d}" for i in range(20)]
    sweeps(store, names[1:], SWEEP, until_min=-10)
    fleet, catalog = fleet_of(*names), Catalog.load()
    assert watched(store, AT, catalog, fleet) == []  # n00 added to the inventory just now
    assert watched(store, AT + 90_000, catalog, fleet) == []  # within 2 sweeps of 60 s
    assert [f["rule_id"] for f in watched(store, AT + 150_000, catalog, fleet)] == [NODE_RULE]


def test_a_host_the_sweep_could_not_reach_is_unknown_unreachable(store):
    names = [f"n{i:02d}" for i in range(20)]
    sweeps(store, [n for n in names if n != "n03"], SWEEP)
    sweeps(store, "n03", SWEEP, until_min=10)
    # the callback's rows for a host it could not reach, one per sweep since
    sweeps(store, "n03", [("ansible_host_unreachable", "node")], since_min=9)
    fleet, catalog = fleet_of(*names), Catalog.load()
    (finding,) = diagnose(store, [], AT, catalog, fleet=fleet)
    assert (finding["rule_id"], finding["node_id"]) == (UNREACHABLE_RULE, "n03")
    assert finding["severity"] == "warning"
    assert "unreachable" in finding["message"]
    assert keys(silences(store, catalog, AT)) == {(UNREACHABLE_RULE, "n03", "")}  # inventory or not
    sweeps(store, "n03", SWEEP, since_min=0.5, until_min=0.5)  # reachable again
    assert silences(store, catalog, AT, fleet) == []


def test_more_than_10_percent_of_the_inventory_silent_is_one_critical_unknown_fleet(store):
    names = [f"n{i:02d}" for i in range(21)]
    sweeps(store, names[:3], SWEEP, until_min=15)
    sweeps(store, names[3:], SWEEP)
    fleet, catalog = fleet_of(*names[:20]), Catalog.load()
    (finding,) = diagnose(store, [], AT, catalog, fleet=fleet)
    assert (finding["rule_id"], finding["node_id"]) == (FLEET_RULE, FLEET_NODE)
    assert finding["severity"] == "critical"
    assert json.loads(finding["evidence"])["nodes"] == ["n00", "n01", "n02"]
    assert finding["actions"] == ["log", "alert"]  # nothing aimed at a host called "fleet"
    # 2 of 20 is 10 %, not more: two nodes of their own
    assert keys(silences(store, catalog, AT, fleet_of(*names[1:]))) == {
        (NODE_RULE, "n01", ""),
        (NODE_RULE, "n02", ""),
    }


def test_a_collectors_count_of_a_nodes_refusals_is_not_unknown_after_the_collector_restarts(store):
    """The per-node refusal counters are written only while a collector has counted something for
    the node; after its restart they stop: the collector's series (device `collector`), no silence."""
    sweeps(store, "node01", SWEEP)
    refusals = [
        ("telemetry_node_packets_rejected_total", "collector"),
        ("telemetry_stream_resyncs_total", "collector"),
    ]
    sweeps(store, "node01", refusals, every_s=5, since_min=60, until_min=20)
    assert silences(store, Catalog.load(), AT) == []


def test_a_metric_a_node_never_had_is_not_unknown(store):
    names = [f"n{i:02d}" for i in range(20)]
    sweeps(store, names, SWEEP)
    sweeps(store, "n05", SMART, since_min=60)  # only n05 has a disk
    assert silences(store, Catalog.load(), AT, fleet_of(*names)) == []


def test_the_silent_set_names_the_series_and_the_nodes_that_stopped(store):
    sweeps(store, "n1", SWEEP)
    sweeps(store, "n1", SMART, until_min=10)
    sweeps(store, "n2", SWEEP, until_min=10)
    silent = silent_series(store, Catalog.load(), AT)
    assert ("n1", "sda", "smart_health_passed") in silent
    assert ("n1", "gpu0", "gpu_temperature_celsius") not in silent
    assert ("n2", "gpu0", "gpu_temperature_celsius") in silent and silent.nodes == {"n2"}
    # a sweep that cannot reach n3 while its stream still flows: the stream's series are not silent
    sweeps(store, "n3", SWEEP, until_min=10)
    sweeps(store, "n3", SWEEP, every_s=5, since_min=15, until_min=0, labels={"source": "stream"})
    sweeps(store, "n3", [("ansible_host_unreachable", "node")], since_min=9)
    silent = silent_series(store, Catalog.load(), AT)
    assert "n3" not in silent.nodes and ("n3", "gpu0", "gpu_temperature_celsius") not in silent
    assert (UNREACHABLE_RULE, "n3", "") in keys(silent.silences)


def test_an_evaluation_in_the_past_does_not_see_rows_that_arrived_after_it(store):
    evaluated = AT - AT % HOUR - HOUR + 30 * MINUTE  # half past the previous hour
    before = (AT - evaluated) / MINUTE  # minutes from that moment to AT
    sweeps(store, "n1", SWEEP, since_min=before + 120)
    sweeps(store, "n1", [("gpu_temperature_celsius", "gpu1")], since_min=before + 120, until_min=before + 10)
    # back in the same hour, after the evaluation time: the hour's rollup holds those rows too
    sweeps(store, "n1", [("gpu_temperature_celsius", "gpu1")], since_min=before - 5, until_min=before - 25)
    (silence,) = silences(store, Catalog.load(), evaluated)
    assert (silence.rule_id, where(silence)) == (DEVICE_RULE, "gpu1")
    assert silence.last_seen_ms == evaluated - 10 * MINUTE
    (now,) = silences(store, Catalog.load(), AT)  # at AT those rows have arrived
    assert now.last_seen_ms == evaluated + 25 * MINUTE


def test_diagnose_with_an_inventory_names_its_node_that_never_reported(store, tmp_path):
    names = [f"n{i:02d}" for i in range(12)]
    sweeps(store, names[1:], SWEEP)
    store.close()
    inventory = tmp_path / "hosts.yml"
    hosts = "".join(f"    {name}: {{}}\n" for name in names)
    inventory.write_text(f"---\nall:\n  vars:\n    stethoscope_sweep_interval: 60\n  hosts:\n{hosts}")

    def run(at_ms):
        command = [
            sys.executable, "-m", "stethoscope.cli", "--dsn", store.dsn,
            "diagnose", "--inventory", str(inventory), "--json",
            "--rules", str(TOP / "rules" / "gpu"), "--at", str(at_ms / 1000),
        ]  # fmt: skip
        result = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
        assert result.returncode in (0, 1), result.stderr
        return [(f["rule_id"], f["node_id"]) for f in json.loads(result.stdout)]

    assert run(AT - 10 * MINUTE) == []  # n00 is new to this inventory
    with Store(store.dsn, store.database) as reopened:  # diagnose only looks: a watch cycle records it
        watched(reopened, AT - 10 * MINUTE, Catalog.load(), fleet_of(*names))
    assert run(AT) == [(NODE_RULE, "n00")]


def test_an_agent_that_stops_is_unknown_within_seconds_while_its_sweeps_keep_their_cadence(store):
    """Regression guard: a stream series was judged on the catalog's interval (60 s, or
    the inventory's sweep interval), so an agent that stopped went unnoticed for 3 minutes or more.
    Its series now stand on the stream's 5-s period (3 periods missing, judged 10 s later for
    delivery and clock skew); the same node's sweep rows keep their own cadence."""
    stream = {"source": "stream", "agg": "max"}
    node_part = [("gpu_temperature_celsius", "node")]
    sweeps(store, ["n1", "n2"], SWEEP, every_s=300, since_min=6 * 60, until_min=4)  # swept every 5 min
    sweeps(store, "n1", node_part, every_s=5, since_min=60, until_min=0.5, labels=stream)  # stopped 30 s ago
    sweeps(
        store, "n2", node_part, every_s=5, since_min=60, until_min=20 / 60, labels=stream
    )  # clock 20 s slow
    swept_every_5_min = Catalog.load().with_intervals(300)
    found = silences(store, swept_every_5_min, AT)
    assert keys(found) == {(DEVICE_RULE, "n1", "node")}
    assert silences(store, swept_every_5_min, AT - 10_000) == []  # 20 s after n1's last sample: not yet


def test_a_longer_agent_period_in_the_inventory_moves_the_streams_unknown_line(store):
    """The agents went from 5 s to 30 s ten minutes ago: the spacing the series showed all day is
    still 5 s, so without the inventory's push_agent_period a sample 60 s old reads as silent."""
    stream = {"source": "stream", "agg": "max"}
    node_part = [("gpu_temperature_celsius", "node")]
    sweeps(store, "n1", SWEEP, every_s=60, since_min=6 * 60, until_min=0)
    sweeps(store, "n1", node_part, every_s=5, since_min=6 * 60, until_min=10, labels=stream)
    sweeps(store, "n1", node_part, every_s=30, since_min=9.5, until_min=1, labels=stream)
    assert keys(silences(store, Catalog.load(), AT)) == {(DEVICE_RULE, "n1", "node")}
    thirty = Fleet((Host("n1", "n1"),), stream_interval=30)
    assert silences(store, Catalog.load(), AT, thirty) == []  # push_agent_period 30: 60 s is two periods


def test_the_collectors_own_health_rows_never_make_its_host_an_unknown_node(store):
    """Regression guard: after `serve` stopped, the controller's host name (under which the collector
    stores its health metrics, device "collector") read as a silent node, alerting."""
    sweeps(store, "n1", SWEEP, until_min=0)
    sweeps(store, "controller", [("telemetry_packets_rejected_total", "collector")], every_s=5, until_min=30)
    assert silences(store, Catalog.load(), AT) == []


def test_the_inventorys_push_agent_period_reaches_unknown(tmp_path):
    """Regression guard: the inventory kept only stethoscope_* vars, so the role's push_agent_period
    never reached UNKNOWN's stream line (always 5 s); YAML may write it 30, 30.0 or "30"."""
    from stethoscope.inventory import load_inventory

    for written in ("30", "30.0", "'30'"):
        path = tmp_path / f"hosts{len(written)}.yml"
        path.write_text(f"---\nall:\n  vars:\n    push_agent_period: {written}\n  hosts:\n    n1: {{}}\n")
        assert Fleet.of(load_inventory(path)).stream_interval == 30, written
    plain = tmp_path / "plain.yml"
    plain.write_text("---\nall:\n  hosts:\n    n1: {}\n")
    assert Fleet.of(load_inventory(plain)).stream_interval == 5


def test_a_node_whose_many_devices_fell_silent_is_one_finding_listing_them_in_one_capped_line(store):
    """Regression guard: three minutes after the last sweep, one UNKNOWN finding per silent
    device, each alerting, some lines 1,579 characters long."""
    gpus = [(f"gpu_{m}", f"gpu{g}") for g in range(8) for m in ("temperature_celsius", "power_watts")]
    nics = [("ib_port_state", f"mlx5_{p}/1") for p in range(8)]
    sweeps(store, "n1", [("cpu_governor_performance", "node")], until_min=0)  # the node still reports
    sweeps(store, "n1", [*gpus, *nics], until_min=10)
    sweeps(store, "n2", SWEEP, until_min=0)
    findings = [f for f in diagnose(store, [], AT, Catalog.load()) if f["rule_id"].startswith("unknown.")]
    (finding,) = findings  # one per node, not one per device
    assert (finding["rule_id"], finding["node_id"], finding["device"]) == (DEVICE_RULE, "n1", "")
    evidence = json.loads(finding["evidence"])
    assert len(evidence["devices"]) == 16 and evidence["devices"]["gpu3"] == [
        "gpu_power_watts",
        "gpu_temperature_celsius",
    ]
    assert finding["message"].startswith("n1: UNKNOWN, 24 series on 16 devices not reported since")
    assert len(finding["message"]) <= 300 and finding["actions"] == ["log", "alert"]


def test_a_host_no_recording_cycle_saw_is_unknown_to_a_one_shot_diagnose_past_the_grace(store):
    """A site that only runs `diagnose --inventory` (it writes nothing): a host of the inventory that
    never reported is UNKNOWN once the store has known the fleet for longer than the grace."""
    names = [f"n{i:02d}" for i in range(20)]
    sweeps(store, names[1:], SWEEP)
    catalog = Catalog.load()
    watched(store, AT - 60 * MINUTE, catalog, fleet_of(*names[1:]))  # the fleet before n00 joined
    (silence,) = silences(store, catalog, AT, fleet_of(*names))
    assert (silence.rule_id, silence.node_id) == (NODE_RULE, "n00")
