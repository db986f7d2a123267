"""Hysteresis (docs/design.md "Rules", the life of a finding): a finding resolves only after its
condition has been clear for a whole window of fresh data, never because a sweep came late or was
lost; a fault present in every sweep is open at every instant, under one transaction, one action.
The lab's real sweeps, laid out every 5 minutes with ±60 s of jitter and a lost sweep."""

from __future__ import annotations

import json
import uuid

from lab_sweeps import jittered
from test_cadence import STATE_FAULTS
from test_execute import inventory

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.rules import load_rules
from stethoscope.inventory import load_inventory
from stethoscope.remediation.cycle import Cycles
from stethoscope.remediation.executor import Context
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, replay_sweeps

MINUTE = 60_000
PORT_RULE = """
- rule_id: ib_port_not_active
  description: the shipped rule's condition, acting by a log line only (test)
  severity: critical
  trigger:
    - {metric: ib_port_state, operator: "!=", threshold: 4, window: 3m, aggregate: max, min_samples: 3}
  action: [{type: log, message: "{{ node_id }} {{ device }} down"}]
"""


def _rules(tmp_path, catalog):
    path = tmp_path / "rules.yml"
    path.write_text(PORT_RULE)
    return load_rules(path, catalog).rules


def _instants(times: list[int], end: int) -> list[int]:
    """Every 5 minutes from 15 minutes after the first sweep to `end`."""
    return list(range(times[0] + 15 * MINUTE, end + 1, 5 * MINUTE))


def test_a_port_down_in_every_sweep_is_open_at_every_instant_under_one_txn_and_one_action(
    tmp_path, tmp_dsn, lab_sweeps
):
    at = now_ms() - MINUTE
    times = jittered(at, 300, 24, seed=19, lost=(9,))  # two hours, one sweep lost
    database = f"t_{uuid.uuid4().hex[:8]}"
    with Store(tmp_dsn, database) as store:
        store.init_schema()
        replay_sweeps(store, lab_sweeps, times)
    catalog = Catalog.load().with_intervals(300)
    log = tmp_path / "findings.log"
    hosts = load_inventory(inventory(tmp_path))
    context = Context(
        tmp_dsn, database, hosts, {"stethoscope_diagnose_log": str(log)}, spool_dir=tmp_path / "s"
    )
    cycles = Cycles(tmp_dsn, database, catalog, execute_with=lambda d, db: context, nodes=sorted(hosts.hosts))
    rules = _rules(tmp_path, catalog)
    seen = []
    for instant in _instants(times, at):
        found = cycles.run(rules, instant).findings
        seen.append({(f["node_id"], f.get("txn_id")) for f in found if f["rule_id"] == "ib_port_not_active"})
    txns = {txn for instant in seen for _, txn in instant}
    assert all(len(instant) == 1 and next(iter(instant))[0] == "node08" for instant in seen), seen
    assert len(txns) == 1  # never resolved in a gap, never reopened under a new transaction
    assert len(log.read_text().splitlines()) == 1  # one action in two hours


def test_a_long_running_dry_run_holds_every_state_fault_open_at_every_instant(tmp_dsn, lab_sweeps):
    at = now_ms() - MINUTE
    times = jittered(at, 300, 20, seed=5, lost=(7,))
    with Store(tmp_dsn) as store:
        store.init_schema()
        replay_sweeps(store, lab_sweeps, times)
    catalog = Catalog.load().with_intervals(300)
    rules = load_rules(TOP / "rules", catalog).rules
    cycles = Cycles(tmp_dsn, None, catalog, long_running=True)  # serve or watch without --execute
    for instant in _instants(times, at):
        found = {(f["node_id"], f["rule_id"]) for f in cycles.run(rules, instant).findings}
        assert found >= STATE_FAULTS, (instant, sorted(STATE_FAULTS - found))
        assert not [f for f in found if f[0] in ("node01", "node05")]


def _port(store, node: str, state: float, at: int) -> None:
    rows = MetricColumns()
    rows.append(node, "ib_port_state", "mlx5_0/1", {}, state, at)
    store.insert_metrics(rows)


def test_a_finding_resolves_only_after_a_whole_window_of_fresh_clear_data(tmp_path, tmp_dsn):
    at = now_ms() - 3 * 3600_000
    database = f"t_{uuid.uuid4().hex[:8]}"
    catalog = Catalog.load().with_intervals(300)
    hosts = load_inventory(inventory(tmp_path))
    context = Context(tmp_dsn, database, hosts, {"stethoscope_diagnose_log": str(tmp_path / "f.log")})
    cycles = Cycles(tmp_dsn, database, catalog, execute_with=lambda d, db: context, nodes=sorted(hosts.hosts))
    rules = _rules(tmp_path, catalog)

    def status() -> str:
        with Store(tmp_dsn, database) as store:
            rows = store.query(
                f"SELECT argMax(status, version) FROM {database}.findings "
                "WHERE rule_id = 'ib_port_not_active'"
            )
        return rows[0][0]

    with Store(tmp_dsn, database) as store:
        store.init_schema()
        for k in range(4):  # down in 4 sweeps, 5 minutes apart
            _port(store, "node08", 1.0, at + k * 5 * MINUTE)
    now = at + 15 * MINUTE
    assert [f["node_id"] for f in cycles.run(rules, now).findings] == ["node08"]
    with Store(tmp_dsn, database) as store:
        _port(store, "node08", 4.0, now + 5 * MINUTE)  # ACTIVE again: one sweep
    held = cycles.run(rules, now + 5 * MINUTE).findings
    assert status() == "open" and "held open" in held[0]["outcome"]
    silent = cycles.run(rules, now + 25 * MINUTE).findings  # no sweep since: a gap is no evidence
    assert status() == "stale" and [f["rule_id"] for f in silent] == ["unknown.node"]  # UNKNOWN speaks
    with Store(tmp_dsn, database) as store:
        for k in (6, 7, 8):  # a whole window (15 min at 300 s) of ACTIVE sweeps
            _port(store, "node08", 4.0, now + k * 5 * MINUTE)
    assert cycles.run(rules, now + 40 * MINUTE).findings == []
    assert status() == "resolved"
    assert json.loads((tmp_path / "f.log").read_text().splitlines()[0])["node_id"] == "node08"


HOT = """
- rule_id: gpu_hot
  description: a GPU runs hot (test)
  severity: warning
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 85, window: 5m, aggregate: min,
       min_samples: 3}
  action: [{type: log, message: "{{ node_id }} {{ device }} hot"}]
"""


def test_a_device_that_falls_silent_leaves_its_finding_stale_however_well_its_node_reports(tmp_path, tmp_dsn):
    """Regression guard (review): the data behind a finding was counted per node, so a GPU that fell
    off the bus while its node's other GPUs kept reporting read as clear, and its finding resolved."""
    at = now_ms() - 2 * 3600_000
    database = f"t_{uuid.uuid4().hex[:8]}"
    catalog = Catalog.load()
    hosts = load_inventory(inventory(tmp_path))
    context = Context(tmp_dsn, database, hosts, {"stethoscope_diagnose_log": str(tmp_path / "f.log")})
    cycles = Cycles(tmp_dsn, database, catalog, execute_with=lambda d, db: context, nodes=sorted(hosts.hosts))
    path = tmp_path / "hot.yml"
    path.write_text(HOT)
    rules = load_rules(path, catalog).rules

    def sweep(minute: int, gpus: dict[str, float]) -> None:
        rows = MetricColumns()
        for gpu, celsius in gpus.items():
            rows.append("node08", "gpu_temperature_celsius", gpu, {}, celsius, at + minute * MINUTE)
        with Store(tmp_dsn, database) as store:
            store.insert_metrics(rows)

    with Store(tmp_dsn, database) as store:
        store.init_schema()
    for minute in range(0, 5):
        sweep(minute, {"gpu0": 40.0, "gpu3": 95.0})
    (found,) = cycles.run(rules, at + 4 * MINUTE).findings
    assert (found["node_id"], found["device"]) == ("node08", "gpu3")
    for minute in range(5, 45):  # gpu3 fell off the bus; gpu0 reports on, cool
        sweep(minute, {"gpu0": 40.0})
    cycles.run(rules, at + 44 * MINUTE)
    with Store(tmp_dsn, database) as store:
        (status,) = store.query(
            f"SELECT argMax(status, version) FROM {database}.findings WHERE rule_id = 'gpu_hot'"
        )[0]
    assert status == "stale"  # never resolved: its GPU said nothing
