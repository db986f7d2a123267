"""How re-baselines are planned (remediation.rebaseline), read straight from the store a cycle plans
from: which nodes joined the fleet, when a re-baseline waits and what `diagnose --plan` says of it,
and which fingerprint change marks a drained node repaired. Nothing here runs a playbook."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from stethoscope.inventory import load_inventory
from stethoscope.remediation.breaker_state import armed
from stethoscope.remediation.context import Context
from stethoscope.remediation.ledger import DRAIN, REBASELINE, REPAIRED, Ledger
from stethoscope.remediation.rebaseline import HARDWARE_RULE, JOINED, Upkeep, candidates, preview_entries
from stethoscope.remediation.reconcile import Orphans
from stethoscope.remediation.silence_table import add_silence
from stethoscope.remediation.silences import parse_matcher
from stethoscope.store.dsn import ConfigError
from stethoscope.timeutil import now_ms

HOUR = 3600_000
DAY = 24 * HOUR
HOSTS = ("node01", "node02", "node03")
GPUS = {"models": ["NVIDIA H100 80GB HBM3"], "count": 8, "driver": "550.54.15", "vbios": ["96.00.89.00.01"]}


def context(tmp_path: Path, hosts: tuple[str, ...] = HOSTS, **settings: Any) -> Context:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n" + "".join(f"    {h}: {{}}\n" for h in hosts))
    made = Context("", None, load_inventory(inventory), overrides=dict(settings))
    made.spool_dir = tmp_path / "spool"
    return made


def sweep(store, node: str, at_ms: int, node_fp: str, class_fp: str = "c", **detail: Any) -> None:
    """A fingerprint sweep's facts row (a baseline's holds the env_lock state: not a sweep's)."""
    facts = {"node_fingerprint": node_fp, "class_fingerprint": class_fp, "detail": {"env_lock": {}, **detail}}
    store.insert_rows(
        "facts",
        [{"node_id": node, "collector": "fingerprint", "run_id": f"r{at_ms}", "collected_at": at_ms,
          "facts": json.dumps(facts)}],
    )  # fmt: skip


def changed(node: str) -> dict[str, Any]:
    return {
        "node_id": node,
        "rule_id": HARDWARE_RULE,
        "finding_id": f"f-{node}",
        "severity": "info",
        "device": "",
    }


def upkeep(ctx: Context, store) -> Upkeep:
    never = Orphans(None, lambda action: 1 << 62)
    return Upkeep(ctx, armed(store, ctx), lambda row: None, 60, never)


def rebaselines(store) -> dict[str, tuple[str, str]]:
    """node -> (status, reason) of each re-baseline, as its latest row says."""
    states = [s for s in Ledger(store).action_states() if s.action == REBASELINE]
    return {s.target: (s.status, str(s.detail.get("reason"))) for s in states}


def will(entries: list[dict[str, Any]], node: str) -> list[str]:
    return [s["will"] for e in entries if e["node"] == node for s in e["steps"] if s["label"] == REBASELINE]


def test_a_merge_of_the_nodes_table_makes_no_node_look_joined(store):
    """`nodes` keeps one row per node, rewritten every sweep: first sight comes from the facts rows,
    and the fleet is the inventory's hosts (a node long gone from it says nothing of when it began)."""
    now = now_ms()
    first_sight = {"node01": now - 20 * DAY, "node02": now - 20 * DAY + 60_000, "node03": now - 2 * HOUR}
    for at in (now - 60 * DAY, now):  # a host gone from the inventory since, then every sweep's rewrite
        store.insert_rows(
            "nodes",
            [{"node_id": n, "slurm_name": n, "rack": "", "switch": "", "groups": [], "updated_at": at}
             for n in [*first_sight, "gone01"]],
        )  # fmt: skip
    for node, at in first_sight.items():
        sweep(store, node, at, f"fp-{node}")
        sweep(store, node, now - HOUR, f"fp-{node}")
    store.command(f"OPTIMIZE TABLE {store.database}.nodes FINAL")
    found = candidates(store, [], list(first_sight), now)
    assert [(c.node, c.why) for c in found] == [("node03", JOINED)]


def test_without_slurm_as_the_scheduler_a_rebaseline_waits_saying_why(tmp_path, store):
    sweep(store, "node02", now_ms() - HOUR, "fp-new")
    ctx = context(tmp_path, stethoscope_rebaseline_window="always")
    due = upkeep(ctx, store).plan(store, [changed("node02")], now_ms())
    assert due.batches == []  # baseline.yml would benchmark it under running jobs
    status, reason = rebaselines(store)["node02"]
    assert status == "waiting" and "stethoscope_scheduler" in reason, reason
    assert will(preview_entries(store, ctx, [changed("node02")], now_ms()), "node02") == [reason]


@pytest.mark.parametrize(
    "settings",
    [{"stethoscope_scheduler": "slurm"}, {"stethoscope_rebaseline_without_scheduler": True}],
)
def test_slurm_or_an_explicit_opt_in_lets_a_rebaseline_run(tmp_path, store, settings):
    sweep(store, "node02", now_ms() - HOUR, "fp-new")
    ctx = context(tmp_path, stethoscope_rebaseline_window="always", **settings)
    assert will(preview_entries(store, ctx, [changed("node02")], now_ms()), "node02") == ["runs"]
    due = upkeep(ctx, store).plan(store, [changed("node02")], now_ms())
    assert [[s.target for s in batch] for batch, _txn in due.batches] == [["node02"]]


def test_the_window_opens_by_the_clock_not_by_the_time_evaluated(tmp_path, store):
    """`diagnose --execute --at <past>` evaluates then, but runs now: the window is now's."""
    past = datetime.now(UTC) - timedelta(days=3)
    window = f"{('mon', 'tue', 'wed', 'thu', 'fri', 'sat', 'sun')[past.weekday()]} 00:00-23:59"
    at_ms = int(past.replace(hour=12, minute=0).timestamp() * 1000)
    sweep(store, "node02", at_ms - HOUR, "fp-new")
    ctx = context(tmp_path, stethoscope_rebaseline_window=window, stethoscope_scheduler="slurm")
    (said,) = will(preview_entries(store, ctx, [changed("node02")], at_ms), "node02")
    assert said.startswith("waiting for the window"), said
    assert upkeep(ctx, store).plan(store, [changed("node02")], at_ms).batches == []
    assert rebaselines(store)["node02"][0] == "waiting"


def test_a_silenced_node_that_joined_is_not_rebaselined(tmp_path, store):
    now = now_ms()
    for node in HOSTS:
        sweep(store, node, now - 20 * DAY if node != "node03" else now - 2 * HOUR, f"fp-{node}")
    ctx = context(tmp_path, stethoscope_rebaseline_window="always", stethoscope_scheduler="slurm")
    assert will(preview_entries(store, ctx, [], now), "node03") == ["runs"]  # it joined
    add_silence(store, (parse_matcher("node_id=node03"),), 3600, "tech", "rack 7 recabling")
    assert will(preview_entries(store, ctx, [], now), "node03") == []
    assert upkeep(ctx, store).plan(store, [], now).batches == []
    assert "node03" not in rebaselines(store)


def test_plan_says_a_rebaseline_the_breaker_has_no_room_for_waits(tmp_path, store):
    now = now_ms()
    sweep(store, "node02", now - HOUR, "fp-new")
    drained = {"txn_id": "t-worn", "finding_id": "f-worn", "action": DRAIN, "target": "node01",
               "status": "ok", "detail": {}, "started_at": now - HOUR, "finished_at": now - HOUR}  # fmt: skip
    Ledger(store).write_action(drained, now - HOUR)  # stethoscope's own limit on 3 nodes: 1
    ctx = context(tmp_path, stethoscope_rebaseline_window="always", stethoscope_scheduler="slurm")
    (said,) = will(preview_entries(store, ctx, [changed("node02")], now), "node02")
    assert said.startswith("waiting for the breaker"), said


def drained_then_swept(store, node: str, **after: Any) -> None:
    """`node` drained by stethoscope an hour ago, swept before with 8 GPUs, and after as `after` says."""
    now = now_ms()
    sweep(store, node, now - 2 * HOUR, "fp-before", "class-c", gpus=GPUS, serials={"gpu": ["1320"]})
    row = {"txn_id": "t-worn", "finding_id": "f-worn", "action": DRAIN, "target": node, "status": "ok",
           "detail": {}, "started_at": now - HOUR, "finished_at": now - HOUR}  # fmt: skip
    Ledger(store).write_action(row, now - HOUR)
    sweep(store, node, now - 60_000, after.pop("node_fp"), after.pop("class_fp"), **after)


def repaired(store) -> list[tuple[str, str, str]]:
    return [
        (s.txn_id, s.target, s.detail.get("by"))
        for s in Ledger(store).action_states()
        if s.action == REPAIRED
    ]


def test_a_part_swapped_for_an_identical_one_marks_the_drained_node_repaired(tmp_path, store):
    drained_then_swept(store, "node02", node_fp="fp-after", class_fp="class-c", gpus=GPUS,
                       serials={"gpu": ["1321"]})  # fmt: skip
    upkeep(context(tmp_path), store).plan(store, [changed("node02")], now_ms())
    assert repaired(store) == [("t-worn", "node02", "fingerprint change")]


@pytest.mark.parametrize(
    "after",
    [
        # a GPU fell off the bus: the class changed (8 -> 7), the node is worse, not repaired
        {"class_fp": "class-d", "gpus": {**GPUS, "count": 7}, "serials": {"gpu": []}},
        # nvidia-smi failed on the sweep: nothing is known of the GPUs
        {"class_fp": "class-e", "gpus": {"error": "nvidia-smi exit code 15"}, "serials": {"gpu": []}},
        {"class_fp": "class-c", "gpus": {"error": "nvidia-smi exit code 15"}, "serials": {"gpu": []}},
        # the same serials (a field that is not a part, e.g. the order a list was read in)
        {"class_fp": "class-c", "gpus": GPUS, "serials": {"gpu": ["1320"]}},
    ],
)
def test_a_fingerprint_change_that_is_no_repair_marks_nothing(tmp_path, store, after):
    drained_then_swept(store, "node02", node_fp="fp-after", **after)
    upkeep(context(tmp_path), store).plan(store, [changed("node02")], now_ms())
    assert repaired(store) == []


def test_plan_says_a_rebaseline_waits_while_the_cycle_drains_for_a_fault(tmp_path, store):
    """`--execute` starts no re-baseline in a cycle that drains for a fault: `--plan` says so."""
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.findings import diagnose
    from stethoscope.diagnosis.rules import load_rules
    from stethoscope.remediation.plan import preview
    from stethoscope.store.batch import MetricColumns

    now = now_ms()
    sweep(store, "node02", now - HOUR, "fp-new")
    folder = tmp_path / "rules"
    folder.mkdir()
    (folder / "worn.yml").write_text(
        "- rule_id: worn_ssd_test\n  description: worn SSD (test)\n  severity: critical\n  level: L4\n"
        '  message: "{{ node_id }} worn"\n'
        '  trigger:\n    - {metric: smart_reallocated_sector_ct, operator: ">", threshold: 100, window: 10m,'
        " aggregate: last}\n  action:\n    - {type: playbook, playbook: remediate/drain.yml}\n"
    )
    rules = load_rules(folder, Catalog.load()).rules
    worn = MetricColumns()
    worn.append("node01", "smart_reallocated_sector_ct", "sda", {}, 184.0, now)
    store.insert_metrics(worn)
    findings = diagnose(store, rules, now)
    upkeep(context(tmp_path), store).plan(store, [changed("node02")], now)  # planned, no window then
    ctx = context(tmp_path, stethoscope_rebaseline_window="always", stethoscope_scheduler="slurm",
                  stethoscope_breaker_min_isolations=3)  # fmt: skip
    entries = preview(store, ctx, findings, rules, now)
    assert [s["will"] for e in entries if e["node"] == "node01" for s in e["steps"]] == ["runs"]
    (said,) = will(entries, "node02")
    assert said.startswith("waiting: this cycle drains"), said


def test_repaired_needs_a_drain_of_the_incidents_node(store, tmp_dsn, capsys):
    """An incident whose txn drained another node: verify would never run for its own node, so the
    mark is refused, saying why."""
    from stethoscope.cli.main import main

    now = now_ms()
    row = {
        "finding_id": "f-multi", "txn_id": "t-multi", "rule_id": "worn_ssd_test", "node_id": "node02",
        "device": "sda", "severity": "critical", "confidence": 1.0, "level": "L4", "message": "m",
        "evidence": "{}", "first_seen": now, "last_seen": now, "status": "open", "version": 1,
    }  # fmt: skip
    store.insert_rows("findings", [row])
    drained = {"txn_id": "t-multi", "finding_id": "f-other", "action": DRAIN, "target": "node01",
               "status": "ok", "detail": {}, "started_at": now, "finished_at": now}  # fmt: skip
    Ledger(store).write_action(drained, now)
    dsn = ("--dsn", tmp_dsn, "--database", store.database)
    assert main(["incidents", "repaired", "t-multi", *dsn]) == 2
    assert "holds no drain of node02" in capsys.readouterr().err
    assert repaired(store) == []


@pytest.mark.parametrize(
    "text", ["sunny 02:00-03:00", "mon- 01:00-02:00", "saturn 02:00-03:00", "-fri 01:00-02:00"]
)
def test_a_window_day_must_be_a_day_name(text):
    from stethoscope.remediation.window import Window

    with pytest.raises(ConfigError, match="stethoscope_rebaseline_window"):
        Window.parse(text)


def test_a_window_day_may_be_spelled_out():
    from stethoscope.remediation.window import Window

    spelled, short = Window.parse("Saturday,sunday 02:00-03:00"), Window.parse("sat,sun 02:00-03:00")
    assert spelled is not None and short is not None and spelled.days == short.days


def test_incidents_show_names_a_rebaseline_by_its_txn(tmp_path, store, tmp_dsn, capsys):
    """`incidents` lists re-baselines by their rb- txn: `incidents show` takes that txn too."""
    from stethoscope.cli.main import main

    sweep(store, "node02", now_ms() - HOUR, "fp-new")
    upkeep(context(tmp_path), store).plan(store, [changed("node02")], now_ms())
    (txn,) = [s.txn_id for s in Ledger(store).action_states() if s.action == REBASELINE]
    dsn = ("--dsn", tmp_dsn, "--database", store.database)
    assert main(["incidents", "show", txn, *dsn]) == 0
    shown = capsys.readouterr().out
    assert txn in shown and "node02" in shown and "waiting" in shown, shown
    assert main(["incidents", "show", txn, "--json", *dsn]) == 0
    (row,) = json.loads(capsys.readouterr().out)["actions"]
    assert (row["txn_id"], row["action"], row["target"], row["status"]) == (
        txn,
        REBASELINE,
        "node02",
        "waiting",
    )
