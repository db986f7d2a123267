"""Re-baselines and verifies that run themselves (remediation.rebaseline), through the executor's real
cycle (`diagnose --execute`, the cycle serve and watch run) on a 3-node lab and a real slurmctld
whose node02 has a real slurmd (a node that never responded is skipped by baseline.yml's preflight,
not drained): a driver change is one re-baseline, waiting outside its window and run inside it
(drain, baseline.yml on node02, resume); `incidents repaired TXN` makes the next cycle verify the
incident by itself."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.dsn import ConfigError
from stethoscope.timeutil import now_ms

from conftest import TOP, ansible_env, slurm_with_slurmd

BIN = Path(sys.executable).parent
SATURDAY_3AM = int(datetime(2026, 12, 5, 3, 0, tzinfo=UTC).timestamp() * 1000)
HOUR = 3600_000


def test_the_window_opens_on_its_days_and_hours_in_utc():
    from stethoscope.remediation.rebaseline import Window

    window = Window.parse("Sat 02:00-06:00")
    assert window is not None and window.open_at(SATURDAY_3AM)
    assert not window.open_at(SATURDAY_3AM + 4 * HOUR)  # 07:00
    assert not window.open_at(SATURDAY_3AM + 24 * HOUR)  # Sunday 03:00
    night = Window.parse("fri 22:00-04:00")  # past midnight: the morning after a day named
    assert night is not None and night.open_at(SATURDAY_3AM) and not night.open_at(SATURDAY_3AM - 48 * HOUR)
    weekdays = Window.parse("mon-fri 01:00-05:00")
    assert weekdays is not None and not weekdays.open_at(SATURDAY_3AM)
    assert weekdays.open_at(SATURDAY_3AM + 2 * 24 * HOUR)  # Monday 03:00
    always = Window.parse("always")
    assert always is not None and always.open_at(SATURDAY_3AM + 7 * HOUR)
    assert Window.parse(None) is None and Window.parse("") is None  # none set: never runs by itself


@pytest.mark.parametrize(
    "text", ["bogus", "sat 02:00", "caturday 02:00-03:00", "sat 25:00-26:00", "sat 02:00-02:00"]
)
def test_an_unreadable_window_names_the_setting(text):
    from stethoscope.remediation.rebaseline import Window

    with pytest.raises(ConfigError, match="stethoscope_rebaseline_window"):
        Window.parse(text)


def test_an_unreadable_window_stops_execute_at_start(tmp_path, tmp_dsn):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    node01: {}\n")
    with Store(tmp_dsn) as store:
        store.init_schema()  # the setting, not a missing schema, is what refuses
    proc = subprocess.run(
        [str(BIN / "stethoscope"), "--dsn", tmp_dsn, "diagnose", "--execute", "--inventory", str(inventory),
         "-e", "stethoscope_rebaseline_window=bogus"],
        cwd=TOP, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2 and "stethoscope_rebaseline_window" in proc.stderr, proc.stderr


def test_a_node_first_seen_after_the_fleet_joins_it_and_the_fleet_itself_does_not(store):
    from stethoscope.remediation.rebaseline import JOINED, candidates

    now = now_ms()
    swept = {"env_lock": {}}  # a sweep's fingerprint (a baseline's holds the locked state)
    first_sight = {"node01": now - 20 * 24 * HOUR, "node02": now - 20 * 24 * HOUR + 60_000,
                   "node03": now - 10 * 24 * HOUR, "node04": now - 2 * HOUR}  # fmt: skip
    store.insert_rows(
        "nodes",
        [{"node_id": n, "slurm_name": n, "rack": "", "switch": "", "groups": [], "updated_at": at}
         for n, at in first_sight.items()],
    )  # fmt: skip
    store.insert_rows(
        "facts",
        [{"node_id": n, "collector": "fingerprint", "run_id": f"r{at}", "collected_at": at,
          "facts": json.dumps({"node_fingerprint": f"fp-{n}", "class_fingerprint": "c", "detail": swept})}
         for n, first in first_sight.items() for at in (first, now - HOUR)],
    )  # fmt: skip
    found = candidates(store, [], list(first_sight), now)
    # node02 came with the fleet's first sweep, node03 joined over a week ago
    assert [(c.node, c.why, c.fingerprint.node_fingerprint) for c in found] == [
        ("node04", JOINED, "fp-node04")
    ]


@pytest.fixture(scope="module")
def slurm_node02(tmp_path_factory):
    """slurmctld with node01 and node03 never responding and node02 a real slurmd (IDLE)."""
    with slurm_with_slurmd(tmp_path_factory.mktemp("slurmd"), "node02", "node[01,03]") as cluster:
        yield cluster


def lab(tmp_path: Path, dsn: str, cluster, faults: str) -> tuple[dict[str, str], Path]:
    """A 3-node lab whose inventory says Slurm is the scheduler (baseline.yml drains first), swept 3
    times by the real collect.yml."""
    cluster.undrain_all()
    inventory = tmp_path / "inv/hosts.yml"
    env = ansible_env(tmp_path, dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"), **cluster.env)
    build = [
        sys.executable,
        str(TOP / "tools/lab.py"),
        "build",
        "--nodes",
        "3",
        "--inventory",
        str(inventory),
    ]
    subprocess.run([*build, "--only-faults", faults], env=env, check=True, capture_output=True)
    settings = {
        "stethoscope_scheduler": "slurm",
        "stethoscope_slurm_environment": cluster.env,
        "bench_storage_repetitions": 1,
        "bench_storage_preheat": False,
        "bench_storage_sustained_seconds": 0,
        # node01 and node03 never responded (no slurmd): the capacity check would count them down
        "baseline_max_out_of_service": 1.0,
        "baseline_capacity_retries": 0,
    }
    with (inventory.parent / "group_vars/all.yml").open("a") as handle:
        handle.write(yaml.safe_dump(settings))
    subprocess.run([BIN / "stethoscope", "db", "init"], env=env, check=True, capture_output=True)
    for _sweep in range(3):
        play = subprocess.run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), str(TOP / "playbooks/collect.yml")],
            env=env, cwd=TOP, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert play.returncode == 0, play.stdout[-3000:]
    return env, inventory


def cycle(env, inventory, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """One executing cycle, as serve runs it every interval."""
    command = [
        str(BIN / "stethoscope"), "diagnose", "--json", "--execute", "--inventory", str(inventory),
        "-e", f"stethoscope_diagnose_log={tmp_path / 'findings.log'}",
        "-e", f"stethoscope_evidence_dir={tmp_path / 'evidence'}", *extra,
    ]  # fmt: skip
    proc = subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc


def latest(dsn: str, action: str) -> list[tuple[str, str, str, dict]]:
    """(txn, node, status, detail) of each `action`, as its latest row says."""
    with Store(dsn) as store:
        rows = store.query(
            "SELECT txn_id, target, argMax(status, version), argMax(detail, version) "
            f"FROM {store.database}.actions WHERE action = {{a:String}} "
            "GROUP BY txn_id, target ORDER BY txn_id",
            {"a": action},
        )
    return [(txn, node, status, json.loads(detail)) for txn, node, status, detail in rows]


def benchmarked(dsn: str) -> list[tuple[str, str]]:
    with Store(dsn) as store:
        return store.query(
            f"SELECT DISTINCT node_id, suite FROM {store.database}.bench_results ORDER BY 1, 2"
        )


def closed_window() -> str:
    """A window on a day that is not today (nor tomorrow, for a run near midnight)."""
    days = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
    today = datetime.now(UTC).weekday()
    return f"{days[(today + 3) % 7]} 00:00-23:00"


def test_a_driver_change_is_one_rebaseline_waiting_for_its_window_then_drained_benchmarked_and_resumed(
    tmp_path, tmp_dsn, slurm_node02
):
    env, inventory = lab(tmp_path, tmp_dsn, slurm_node02, "driver_upgrade")
    outside = ("-e", f"stethoscope_rebaseline_window={closed_window()}")
    for _cycle in range(2):  # the finding matches every cycle: planned once
        cycle(env, inventory, tmp_path, *outside)
        ((txn, node, status, detail),) = latest(tmp_dsn, "rebaseline")
        assert (node, status, detail["why"]) == ("node02", "waiting", "fingerprint changed")
        assert detail["reason"].startswith("waiting for the window")
        assert latest(tmp_dsn, "baseline:drain") == []
    listed = subprocess.run(
        [str(BIN / "stethoscope"), "incidents"], env=env, cwd=TOP, capture_output=True, text=True, check=True
    )
    assert f"{txn:<20} node02         waiting" in listed.stdout
    plan = subprocess.run(
        [str(BIN / "stethoscope"), "diagnose", "--plan", "--inventory", str(inventory), *outside],
        env=env, cwd=TOP, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert f"txn {txn}" in plan.stdout and "rebaseline: waiting for the window" in plan.stdout, plan.stdout

    assert benchmarked(tmp_dsn) == []
    inside = cycle(env, inventory, tmp_path, "-e", "stethoscope_rebaseline_window=always")
    ((same, node, status, detail),) = latest(tmp_dsn, "rebaseline")
    assert (same, node, status) == (txn, "node02", "ok"), detail
    batch = detail["batch_txn"]
    assert detail["batch"] == ["node02"]
    # drain-first: baseline.yml's preflight drained node02 under the batch's txn and resumed it
    assert [(t, n, s) for t, n, s, _ in latest(tmp_dsn, "baseline:drain")] == [(batch, "node02", "ok")]
    assert [(t, n, s) for t, n, s, _ in latest(tmp_dsn, "baseline:resume")] == [(batch, "node02", "ok")]
    assert "DRAIN" not in slurm_node02.node("node02")["state"]
    assert "action rebaseline ok: node node02 rule hardware_changed_rebaseline" in inside.stderr
    assert {node for node, _suite in benchmarked(tmp_dsn)} == {"node02"}  # that node alone

    cycle(env, inventory, tmp_path, "-e", "stethoscope_rebaseline_window=always")  # done: not again
    assert [(t, s) for t, _, s, _ in latest(tmp_dsn, "rebaseline")] == [(txn, "ok")]
    assert len(latest(tmp_dsn, "baseline:drain")) == 1


def worn_rule(tmp_path: Path) -> Path:
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "worn.yml").write_text(
        textwrap.dedent("""
        - rule_id: worn_ssd_test
          description: worn SSD (test)
          severity: critical
          level: L4
          message: "{{ node_id }} {{ device }} worn"
          trigger:
            - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 10m,
               aggregate: last}
          action:
            - {type: playbook, playbook: remediate/drain.yml}
        """)
    )
    return folder


def test_an_incident_marked_repaired_is_verified_by_the_next_cycle_without_a_human_command(
    tmp_path, tmp_dsn, slurm_node02
):
    env, inventory = lab(tmp_path, tmp_dsn, slurm_node02, "none")
    rules = ("--rules", str(worn_rule(tmp_path)))
    with Store(tmp_dsn) as store:
        batch = MetricColumns()
        batch.append("node02", "smart_reallocated_sector_ct", "sda", {}, 184.0, now_ms())
        store.insert_metrics(batch)
    cycle(env, inventory, tmp_path, *rules)
    ((txn, node, status, _),) = latest(tmp_dsn, "playbook:remediate/drain.yml")
    assert (node, status) == ("node02", "ok") and "DRAIN" in slurm_node02.node("node02")["state"]
    cycle(env, inventory, tmp_path, *rules)
    assert latest(tmp_dsn, "playbook:remediate/verify.yml") == []  # nobody said it was repaired

    cli = [str(BIN / "stethoscope"), "incidents"]
    marked = subprocess.run([*cli, "repaired", txn, "--by", "tech", "--note", "SSD replaced"],
                            env=env, cwd=TOP, capture_output=True, text=True, check=False)  # fmt: skip
    assert marked.returncode == 0, marked.stderr
    assert [(t, n, d["by"]) for t, n, _, d in latest(tmp_dsn, "repaired")] == [(txn, "node02", "tech")]

    done = cycle(env, inventory, tmp_path, *rules)
    ((same, node, status, detail),) = latest(tmp_dsn, "playbook:remediate/verify.yml")
    assert (same, node) == (txn, "node02") and status in ("ok", "failed"), detail
    tasks = {(e["task"], e["event"]) for e in detail["events"] if e["host"] == "node02"}
    # verify.yml ran: the drain checked as stethoscope's before any benchmark, the node re-benchmarked
    assert (
        "Check the drain is stethoscope's, under this transaction, before any benchmark",
        "runner_on_ok",
    ) in tasks
    assert ("Set the environment to locked", "runner_on_ok") in tasks, sorted(tasks)
    # and gave its verdict: resumed (ok), or kept drained saying why (failed)
    assert status == "ok" or "not resuming node02" in detail["reason"], detail["reason"]
    drained = "DRAIN" in slurm_node02.node("node02")["state"]
    assert drained == (status == "failed"), detail["reason"]  # resumed exactly when verify said so
    assert f"action playbook:remediate/verify.yml {status}: node node02" in done.stderr

    cycle(env, inventory, tmp_path, *rules)  # one verify per repair mark
    assert [s for _, _, s, _ in latest(tmp_dsn, "playbook:remediate/verify.yml")] == [status]
    shown = subprocess.run([*cli, "show", txn], env=env, cwd=TOP, capture_output=True, text=True, check=True)
    assert "repaired" in shown.stdout and "playbook:remediate/verify.yml" in shown.stdout


def upkeep_on(store, tmp_path: Path, orphans):
    """An executing cycle's re-baselines on a 3-node inventory with the window always open."""
    from stethoscope.inventory import Host, Inventory
    from stethoscope.remediation.breaker import CircuitBreaker
    from stethoscope.remediation.context import Context
    from stethoscope.remediation.rebaseline import Upkeep

    hosts = {n: Host(n, n) for n in ("node01", "node02", "node03")}
    inventory = Inventory(tmp_path / "hosts.yml", hosts, {})
    settings = {"stethoscope_rebaseline_window": "always", "stethoscope_scheduler": "slurm"}
    context = Context(store.dsn, store.database, inventory, settings)
    breaker = CircuitBreaker(3)
    return Upkeep(context, breaker, lambda row: None, 1800, orphans), breaker


def rebaseline_row(node: str, status: str, started: int, **detail) -> dict:
    from stethoscope.remediation.rebaseline import rebaseline_txn

    return {
        "txn_id": rebaseline_txn(node, f"fp-{node}"), "finding_id": "", "action": "rebaseline",
        "target": node, "status": status, "started_at": started, "finished_at": None,
        "detail": {"why": "joined the fleet", "node_fingerprint": f"fp-{node}", "class_fingerprint": "c",
                   "reason": "planned", **detail},
    }  # fmt: skip


def test_a_batch_this_executor_still_runs_is_not_taken_for_dead_and_run_twice(store, tmp_path):
    from stethoscope.remediation.ledger import Ledger
    from stethoscope.remediation.reconcile import Orphans, owner

    eleven_minutes_ago = now_ms() - 11 * 60_000
    row = rebaseline_row("node02", "running", eleven_minutes_ago, batch_txn="rbb-live", batch=["node02"],
                         executor=owner())  # fmt: skip
    Ledger(store).write_action(row, eleven_minutes_ago)
    # the pool runs it under its batch's key; its row carries the node's own txn
    upkeep, _ = upkeep_on(store, tmp_path, Orphans(None, lambda action: 600_000, busy={"rbb-live"}))
    assert upkeep.plan(store, [], now_ms()).batches == []


def test_a_batch_whose_executor_died_runs_again_under_its_recorded_txn_and_members(store, tmp_path):
    from stethoscope.remediation.ledger import Ledger
    from stethoscope.remediation.reconcile import Orphans, owner

    dead = {**owner(), "pid": 2**22 + 12345}  # above any pid_max: no such process
    started = now_ms() - 60_000
    ledger = Ledger(store)
    ledger.write_action(
        rebaseline_row("node02", "running", started, batch_txn="rbb-old", batch=["node02"], executor=dead),
        started,
    )
    ledger.write_action(rebaseline_row("node03", "waiting", started), started + 1)
    upkeep, _ = upkeep_on(store, tmp_path, Orphans(None, lambda action: 600_000))
    due = upkeep.plan(store, [], now_ms())
    # its baseline drain is `stethoscope: baseline rbb-old`: only that txn resumes it
    assert sorted(([s.target for s in batch], txn == "rbb-old") for batch, txn in due.batches) == [
        (["node02"], True),
        (["node03"], False),
    ]


def test_a_rebaseline_holds_no_breaker_permit(store, tmp_path):
    from stethoscope.remediation.ledger import Ledger
    from stethoscope.remediation.reconcile import Orphans

    started = now_ms() - 60_000
    Ledger(store).write_action(rebaseline_row("node02", "waiting", started), started)
    upkeep, breaker = upkeep_on(store, tmp_path, Orphans(None, lambda action: 600_000))
    due = upkeep.plan(store, [], now_ms())
    assert [[s.target for s in batch] for batch, _ in due.batches] == [["node02"]]
    # planned work, not an isolation: a fault drain of another node still has the breaker's room
    assert breaker.own == set() and breaker.room("node01")[0]


def test_a_node_held_by_a_stethoscope_drain_is_left_out_of_batches(store, tmp_path):
    from stethoscope.remediation.ledger import DRAIN, Ledger
    from stethoscope.remediation.reconcile import Orphans

    started = now_ms() - 60_000
    ledger = Ledger(store)
    ledger.write_action(rebaseline_row("node02", "waiting", started), started)
    ledger.write_action(rebaseline_row("node03", "waiting", started), started)
    ledger.write_action(
        {"txn_id": "t-fault", "finding_id": "f", "action": DRAIN, "target": "node02", "status": "ok",
         "detail": {}, "started_at": started, "finished_at": started},
        started,
    )  # fmt: skip
    upkeep, _ = upkeep_on(store, tmp_path, Orphans(None, lambda action: 600_000))
    due = upkeep.plan(store, [], now_ms())
    # its verify benchmarks it: a re-baseline beside it would run baseline.yml on it at the same time
    assert [[s.target for s in batch] for batch, _ in due.batches] == [["node03"]]
    (state,) = [s for s in ledger.action_states() if s.target == "node02" and s.action == "rebaseline"]
    assert state.status == "waiting" and "t-fault" in state.detail["reason"]


def write_rows(dsn: str, *rows: dict) -> None:
    from stethoscope.remediation.ledger import Ledger

    with Store(dsn) as store:
        for row in rows:
            Ledger(store).write_action(row, row["started_at"])


def test_a_batch_cut_off_by_a_crash_runs_again_under_its_txn_and_a_skipped_node_waits_to_retry(
    tmp_path, tmp_dsn, slurm_node02
):
    from stethoscope.remediation.reconcile import owner

    env, inventory = lab(tmp_path, tmp_dsn, slurm_node02, "none")
    # the executor died mid-run: node02 left drained by its batch's own preflight
    slurm_node02.scontrol("update", "NodeName=node02", "State=DRAIN", "Reason=stethoscope: baseline rbb-0ld")
    dead = {**owner(), "pid": 2**22 + 12345}
    started = now_ms() - 60_000
    members = {"batch_txn": "rbb-0ld", "batch": ["node01", "node02"], "executor": dead}
    write_rows(tmp_dsn, *(rebaseline_row(n, "running", started, **members) for n in ("node01", "node02")))

    cycle(env, inventory, tmp_path, "-e", "stethoscope_rebaseline_window=always")
    rows = {node: (status, detail) for _, node, status, detail in latest(tmp_dsn, "rebaseline")}
    assert rows["node02"][0] == "ok" and rows["node02"][1]["batch_txn"] == "rbb-0ld", rows["node02"]
    assert "DRAIN" not in slurm_node02.node("node02")["state"]  # only its own txn could resume it
    assert ("rbb-0ld", "node02", "ok") in [(t, n, s) for t, n, s, _ in latest(tmp_dsn, "baseline:resume")]
    # node01 never answered: the preflight skipped it; it waits for a later window, its try counted
    status, detail = rows["node01"]
    assert (status, detail["attempts"]) == ("waiting", 1), detail
    assert detail["reason"].startswith("skipped by baseline.yml's preflight"), detail["reason"]
    skips = len(latest(tmp_dsn, "baseline:skip"))
    cycle(env, inventory, tmp_path, "-e", "stethoscope_rebaseline_window=always")
    assert len(latest(tmp_dsn, "baseline:skip")) == skips  # not run again in the next cycle


def test_a_rebaseline_past_its_timeout_is_restored_and_its_own_drain_resumed(tmp_path, tmp_dsn, slurm_node02):
    env, inventory = lab(tmp_path, tmp_dsn, slurm_node02, "none")
    fios = [p for p in (tmp_path / "lab").rglob("fio") if p.is_file()]
    assert fios, "the lab has no fio"
    for fio in fios:  # a storage suite that outlasts the re-baseline's timeout
        fio.write_text("#!/bin/sh\nexec sleep 400\n")
    started = now_ms() - 60_000
    write_rows(tmp_dsn, rebaseline_row("node02", "waiting", started))
    cycle(env, inventory, tmp_path, "-e", "stethoscope_rebaseline_window=always",
          "-e", "stethoscope_rebaseline_timeout=150")  # fmt: skip
    ((_, node, status, detail),) = latest(tmp_dsn, "rebaseline")
    assert (node, status, detail["runner_status"]) == ("node02", "waiting", "timeout"), detail
    assert detail["restore"]["ok"], detail["restore"]
    batch = detail["reason"]
    ((drained, _, _, _),) = latest(tmp_dsn, "baseline:drain")
    # killed before baseline.yml's `always`: baseline_restore.yml resumed the batch's own drain
    assert [(t, n) for t, n, _, _ in latest(tmp_dsn, "baseline:resume")] == [(drained, "node02")], batch
    assert "DRAIN" not in slurm_node02.node("node02")["state"]


def test_each_node_of_a_batch_has_its_own_outcome():
    from stethoscope.remediation.rebaseline import node_outcomes

    result = {
        "ok": False, "rc": 2, "runner_status": "failed",
        "events": [
            {"event": "runner_on_ok", "host": "node01", "task": "Say what the preflight decided",
             "msg": "baseline preflight node01: skipped: node01 has a running job (DRAINING): resumed"},
            {"event": "runner_on_failed", "host": "node03", "task": "Run the compute suite",
             "msg": "GEMM wrong"},
        ],
        "failed_hosts": ["node03"], "ran_hosts": ["node01", "node02", "node03"],
    }  # fmt: skip
    outcomes = node_outcomes(["node01", "node02", "node03"], result)
    assert outcomes["node01"][0] == "waiting" and "running job" in outcomes["node01"][1]
    assert outcomes["node02"] == ("ok", "")  # one node's failure fails no other
    assert outcomes["node03"] == ("failed", "node03: Run the compute suite: GEMM wrong")
    cut_off = {**result, "runner_status": "timeout", "events": [], "failed_hosts": []}
    assert {status for status, _ in node_outcomes(["node02"], cut_off).values()} == {"failed"}


def test_a_cycle_that_drains_for_a_fault_starts_no_rebaseline(store, tmp_path):
    from stethoscope.remediation.ledger import Ledger
    from stethoscope.remediation.reconcile import Orphans

    started = now_ms() - 60_000
    Ledger(store).write_action(rebaseline_row("node02", "waiting", started), started)
    upkeep, _ = upkeep_on(store, tmp_path, Orphans(None, lambda action: 600_000))
    assert upkeep.plan(store, [], now_ms(), batches=False).batches == []
    assert upkeep.plan(store, [], now_ms()).batches != []  # the next cycle without one does
