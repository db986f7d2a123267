"""The 5-second rules (rules/stream/): data that fires each and data that must not, fed as the agents
send it (datagrams of the metric set's parts, through the collector into the store)."""

from __future__ import annotations

import math

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.writer import WriteReport
from stethoscope.telemetry import wire
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector
from stethoscope.timeutil import now_ms

from conftest import TOP

CATALOG = Catalog.load()
LOADED = load_rules(TOP / "rules" / "stream", CATALOG)
RULES = {rule.rule_id: rule for rule in LOADED.rules}
METRIC_SET = load_sets()["gpu_node"]
SECRET = b"stream-rules-secret-0123456789"
NODES = {1: "bad", 2: "good"}
STEP_MS = 5_000


@pytest.fixture
def at() -> int:
    """The evaluation instant, taken when the test runs: the collector refuses samples older than
    its staleness limit, so an instant fixed at import went stale in a long suite."""
    return now_ms() - 30_000


def stream(store, node: str, part: int, series: dict[str, list[float]], at: int) -> None:
    """Send `series` (metric -> values, one per 5 s, the last at `at`) as the agent would, part `part`."""
    keyring = Keyring(dict(NODES), [SECRET])

    def sink(batch):
        return WriteReport(stored=store.write_batch(batch))

    collector = Collector(keyring, {METRIC_SET.id: METRIC_SET}, sink, listen=("127.0.0.1", 0))
    node_key, key = keyring.key_for(node)
    slots = METRIC_SET.slots(part)
    length = max(len(values) for values in series.values())
    for seq in range(length):
        ts = at - (length - 1 - seq) * STEP_MS
        values = [series[slot.metric][seq] if slot.metric in series else math.nan for slot in slots]
        datagram = wire.encode(
            key,
            set_id=METRIC_SET.id,
            node_key=node_key,
            part=part,
            boot_epoch=1,
            seq=seq,
            ts_ms=ts,
            values=values,
        )
        assert collector.handle(datagram, now_ms=ts) is None
    collector.flush()
    collector.sock.close()


def ramp(start: float, stop: float, n: int) -> list[float]:
    return [start + (stop - start) * i / (n - 1) for i in range(n)]


GPU0 = 1  # part 1 is gpu0
CASES = {
    "stream_ib_congestion_rising": (
        (wire.NODE_PART, {"ib_port_xmit_wait_per_second": ramp(1_000, 400_000, 26)}),
        [
            (wire.NODE_PART, {"ib_port_xmit_wait_per_second": [300_000, 310_000] * 13}),  # high, flat
            (wire.NODE_PART, {"ib_port_xmit_wait_per_second": ramp(0, 50_000, 26)}),  # rising, small
        ],
    ),
    "stream_gpu_pcie_rx_collapse": (
        (
            GPU0,
            {
                "gpu_pcie_rx_mb_per_s": [5_000.0] * 80 + [20.0] * 38,
                "gpu_utilization_percent": [97.0] * 118,
            },
        ),
        [
            # compute-bound from the start: never had PCIe traffic to lose
            (GPU0, {"gpu_pcie_rx_mb_per_s": [20.0] * 118, "gpu_utilization_percent": [97.0] * 118}),
            # the traffic stopped because the job did: the GPU went idle too
            (
                GPU0,
                {
                    "gpu_pcie_rx_mb_per_s": [5_000.0] * 80 + [5.0] * 38,
                    "gpu_utilization_percent": [97.0] * 80 + [0.0] * 38,
                },
            ),
        ],
    ),
    "stream_gpu_sm_clock_drop_under_load": (
        (GPU0, {"gpu_sm_clock_mhz": [795.0] * 38, "gpu_utilization_percent": [99.0] * 38}),
        [
            (GPU0, {"gpu_sm_clock_mhz": [345.0] * 38, "gpu_utilization_percent": [0.0] * 38}),  # idle
            (GPU0, {"gpu_sm_clock_mhz": [1980.0] * 38, "gpu_utilization_percent": [99.0] * 38}),  # busy
        ],
    ),
}


def test_the_stream_rules_load_and_each_has_cases() -> None:
    assert LOADED.errors == [] and set(RULES) == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
@pytest.mark.parametrize("quiet_case", [0, 1])
def test_stream_rule_fires_on_its_transient_and_not_on_the_lookalike(store, rule_id, quiet_case, at) -> None:
    firing, quiet = CASES[rule_id]
    stream(store, "bad", *firing, at)
    stream(store, "good", *quiet[quiet_case], at)
    matches = evaluate(store, RULES[rule_id], at)
    assert [m.node_id for m in matches] == ["bad"]


def test_a_minute_sweep_alone_does_not_fire_a_stream_rule(store, at) -> None:
    """The same values without the source=stream label (sweeps, ingest) are not the stream's evidence."""
    from stethoscope.store.batch import MetricColumns

    rows = MetricColumns()
    for i in range(40):  # as often as the stream, but not the stream's rows
        for metric, value in (("gpu_sm_clock_mhz", 795.0), ("gpu_utilization_percent", 99.0)):
            rows.append("bad", metric, "gpu0", {}, value, at - i * STEP_MS)
    store.insert_metrics(rows)
    assert evaluate(store, RULES["stream_gpu_sm_clock_drop_under_load"], at) == []


# CI missed the rising-congestion case at 1_796_172_475_792 ms: a least-squares slope over raw epoch
# hours (~5e5) cancelled catastrophically at a 2-minute window, so its sign hung on the milliseconds.
# Twelve instants ten minutes apart (each window holds only its own ramp) with other milliseconds,
# taken at import within the raw TTL: rows older than it would be dropped on insert.
_LAST = now_ms() - 3_600_000
SLOPE_INSTANTS = [_LAST - i * (600_000 + 997) for i in range(12)]


def test_a_ramp_fires_the_slope_rule_at_every_instant(store) -> None:
    firing, _ = CASES["stream_ib_congestion_rising"]
    fired = []
    for at in SLOPE_INSTANTS:
        stream(store, "bad", *firing, at)
        fired.append([m.node_id for m in evaluate(store, RULES["stream_ib_congestion_rising"], at)])
    assert fired == [["bad"]] * len(SLOPE_INSTANTS)
