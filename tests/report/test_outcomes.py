"""`stethoscope outcomes`: per ISO week and catalog layer the medians and 90th percentiles of the time
from first evidence to finding (MTTD), to isolation and to ticket, and the counts of repairs,
resumptions without repair, calls for a person and breaker refusals, from findings and actions rows
written as the executor writes them (remediation.ledger), metrics and a confirmed fault; --json's
keys; an empty window says so and exits 0; a bad --since is exit 2."""

from __future__ import annotations

import datetime as dt
import json
import statistics
import subprocess
import sys

import pytest
from test_execute import AT, db, diagnose, execute_args, rules, worn

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.levels import finding_id
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import rules_dir
from stethoscope.remediation.ledger import DRAIN, ESCALATE, NEEDS_PERSON, RESUME, TICKET, Ledger, note_row
from stethoscope.remediation.repair import RESUMED_WITHOUT_REPAIR
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.faults import Fault, record
from stethoscope.timeutil import to_ms

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute

MIN = 60_000
UNTIL = to_ms("2026-11-26T12:00:00Z")  # a Thursday of ISO week 2026-W48
WEEK48 = to_ms("2026-11-24T08:00:00Z")
WEEK47 = to_ms("2026-11-18T08:00:00Z")
KEYS = {
    "week",
    "layer",
    "incidents",
    "mttd_minutes",
    "isolation_minutes",
    "ticket_minutes",
    "l4_ticket_minutes",
    "repairs",
    "resumed_without_repair",
    "needs_person",
    "refused_by_breaker",
}


def cli(dsn, *args):
    command = [
        sys.executable,
        "-m",
        "stethoscope.cli",
        "--dsn",
        dsn,
        "outcomes",
        "--until",
        str(UNTIL // 1000),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)


def p90(values):
    """Linear interpolation between closest ranks, as numpy's default."""
    ordered = sorted(values)
    rank = 0.9 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (rank - low), 2)


class Lab:
    """Writes what the loop would have: findings (open), each action's intent (in_flight) and then its
    outcome, metric samples, a confirmed fault; every row a newer version than the last."""

    def __init__(self, store: Store):
        self.store = store
        self.ledger = Ledger(store)
        self.version = 1

    def finding(self, txn, rule_id, node, device, first_ms, level="L4"):
        fid = finding_id(rule_id, node, device)
        finding = {
            "finding_id": fid,
            "txn_id": txn,
            "rule_id": rule_id,
            "node_id": node,
            "device": device,
            "severity": "critical",
            "confidence": 0.9,
            "level": level,
            "message": f"{node} {device}: {rule_id}",
            "evidence": "{}",
            "first_seen_ms": first_ms,
        }
        self.version += 1
        self.ledger.write_findings([(finding, "open", self.version, first_ms)])
        return fid

    def action(self, txn, fid, action, node, status, started_ms, finished_ms, detail=None):
        row = {
            "txn_id": txn,
            "finding_id": fid,
            "action": action,
            "target": node,
            "status": "in_flight",
            "detail": {"attempt": 1},
            "started_at": started_ms,
            "finished_at": None,
        }
        self.version += 1
        self.ledger.write_action(row, self.version)
        self.version += 1
        row.update(status=status, detail=detail or {"attempt": 1}, finished_at=finished_ms)
        self.ledger.write_action(row, self.version)

    def samples(self, node, metric, device, points):
        rows = MetricColumns()
        for t, v in points:
            rows.append(node, metric, device, {}, v, t)
        self.store.insert_metrics(rows)


@pytest.fixture(scope="module")
def windows():
    rules = {r.rule_id: r for r in load_rules(rules_dir(), Catalog.load()).rules}
    return {rule_id: rules[rule_id].conditions[0].window_seconds * 1000 for rule_id in rules}


@pytest.fixture(scope="module")
def history(tmp_path_factory, windows):
    """Week 48: three compute incidents (an ECC rule on a raw value; the third re-isolates the first's
    node, resumed without repair, under the same finding_id), one network (a counter's delta), two
    storage with no first sample (a growth rule, a model finding); week 47: one compute incident whose
    confirmed fault began before its samples crossed; one incident before the window."""
    dsn = f"chdb://{tmp_path_factory.mktemp('outcomes') / 'db'}"
    expected = {"dsn": dsn}
    with Store(dsn) as store:
        store.init_schema()
        lab = Lab(store)
        ecc = "gpu_ecc_uncorrected_volatile_total"
        mttd, isolation, ticket = [3, 1, 4], [2, 4, None], [6, 8, 20]
        for n, (first_ms, lead) in enumerate(
            zip((WEEK48, WEEK48 + 60 * MIN, WEEK48 + 120 * MIN), mttd, strict=True)
        ):
            node, txn = ("node01", "node02", "node01")[n], f"t48c{n}"
            lab.samples(node, ecc, "gpu0", [(first_ms - 4 * MIN - 30_000, 0.0), (first_ms - lead * MIN, 2.0)])
            lab.samples(node, ecc, "gpu1", [(first_ms - 4 * MIN, 7.0)])  # another GPU: not its evidence
            fid = lab.finding(txn, "gpu_volatile_dbe", node, "gpu0", first_ms)
            lab.action(txn, fid, "log", node, "ok", first_ms, first_ms)
            if isolation[n] is not None:
                lab.action(txn, fid, DRAIN, node, "ok", first_ms, first_ms + isolation[n] * MIN)
            else:  # refused by the breaker, then drained later by nobody
                lab.action(txn, fid, DRAIN, node, "refused", first_ms, first_ms, {"reason": "breaker"})
            lab.action(txn, fid, TICKET, node, "ok", first_ms, first_ms + ticket[n] * MIN)
        lab.action("t48c0", "", RESUME, "node01", "ok", WEEK48 + 100 * MIN, WEEK48 + 100 * MIN)
        lab.action("t48c1", "", NEEDS_PERSON, "node02", "ok", WEEK48 + 90 * MIN, WEEK48 + 90 * MIN)
        # t48c2 re-isolates a node verify resumed: the escalation row as the executor writes it
        escalation = {"from": "warning", "to": "critical", "rule_id": "gpu_volatile_dbe"}
        escalation.update(reason=RESUMED_WITHOUT_REPAIR, resumed_txn="t48c0", runs=[DRAIN])
        fid = finding_id("gpu_volatile_dbe", "node01", "gpu0")
        lab.ledger.write_action(note_row("t48c2", ESCALATE, "node01", escalation, fid), lab.version + 1)

        expected["week48_compute"] = {"mttd": mttd, "isolation": [2, 4], "ticket": ticket}

        # network: ib_symbol_errors (delta over its window): the counter's first growth is the evidence
        window = windows["ib_symbol_errors"]
        first_ms = WEEK48 + 30 * MIN
        lab.samples(
            "node05", "ib_symbol_errors_total", "mlx5_0/1",
            [(first_ms - window + MIN, 10.0), (first_ms - 40 * MIN, 10.0), (first_ms - 25 * MIN, 90.0),
             (first_ms - 5 * MIN, 200.0), (first_ms - window - 10 * MIN, 0.0)],
        )  # fmt: skip
        fid = lab.finding("t48n", "ib_symbol_errors", "node05", "mlx5_0/1", first_ms, level="L3")
        lab.action("t48n", fid, TICKET, "node05", "ok", first_ms, first_ms + 11 * MIN)
        expected["week48_network"] = {"mttd": [25], "ticket": [11]}

        # storage judged on growth and a model finding: incidents, no first sample to measure
        lab.finding("t48s", "ssd_reallocated_growth", "node06", "sda", WEEK48 + 10 * MIN)
        lab.finding("t48m", "model.storage", "node07", "", WEEK48 + 20 * MIN)
        # a family: a later finding of the same transaction does not move its start
        lab.finding("t48n", "ib_symbol_errors_rising", "node05", "mlx5_0/1", first_ms + 50 * MIN)

        # week 47: the confirmed fault's impact (30 min before) is earlier than the crossing (3 min)
        first_ms = WEEK47
        lab.samples("node08", ecc, "gpu2", [(first_ms - 3 * MIN, 1.0)])
        fid = lab.finding("t47c", "gpu_volatile_dbe", "node08", "gpu2", first_ms)
        lab.action("t47c", fid, DRAIN, "node08", "ok", first_ms, first_ms + 5 * MIN)
        lab.action("t47c", fid, TICKET, "node08", "failed", first_ms, first_ms + 9 * MIN)
        record(
            store, Fault("node08", "gpu_volatile_dbe", "compute", first_ms - 30 * MIN, "gpu2", "confirmed")
        )
        expected["week47_compute"] = {"mttd": [30], "isolation": [5]}

        lab.finding("told", "gpu_volatile_dbe", "node09", "gpu0", UNTIL - 40 * 86_400_000)  # outside 30d
        # merged: t48c0's findings row gives way to t48c2's (one finding_id); its actions remain
        store.command(f"OPTIMIZE TABLE {store.database}.findings FINAL")
        assert store.query(f"SELECT count() FROM {store.database}.findings WHERE txn_id = 't48c0'") == [(0,)]
    return expected


def rows_of(dsn, *args):
    done = cli(dsn, "--json", *args)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    return found, {(row["week"], row["layer"]): row for row in found["rows"]}


def test_medians_per_week_and_layer(history):
    found, rows = rows_of(history["dsn"])
    assert sorted(rows) == sorted(
        [
            ("2026-W47", "compute"),
            ("2026-W47", "all"),
            ("2026-W48", "compute"),
            ("2026-W48", "network"),
            ("2026-W48", "storage"),
            ("2026-W48", "all"),
            ("all", "all"),
        ]
    )
    compute = rows[("2026-W48", "compute")]
    want = history["week48_compute"]
    assert compute["incidents"] == 3
    assert compute["mttd_minutes"] == {
        "median": statistics.median(want["mttd"]),
        "p90": p90(want["mttd"]),
        "n": 3,
    }
    assert compute["isolation_minutes"] == {
        "median": statistics.median(want["isolation"]),
        "p90": p90(want["isolation"]),
        "n": 2,
    }
    assert compute["ticket_minutes"] == {"median": 8.0, "p90": p90(want["ticket"]), "n": 3}
    assert compute["l4_ticket_minutes"] == compute["ticket_minutes"]  # all three L4
    assert (compute["repairs"], compute["resumed_without_repair"]) == (1, 1)
    assert (compute["needs_person"], compute["refused_by_breaker"]) == (1, 1)

    network = rows[("2026-W48", "network")]
    assert network["incidents"] == 1
    assert network["mttd_minutes"] == {"median": 25.0, "p90": 25.0, "n": 1}
    assert network["ticket_minutes"]["median"] == 11.0
    assert network["l4_ticket_minutes"] == {"median": None, "p90": None, "n": 0}  # an L3 incident
    assert network["isolation_minutes"] == {"median": None, "p90": None, "n": 0}

    storage = rows[("2026-W48", "storage")]  # a growth rule and the model's storage class
    assert storage["incidents"] == 2
    assert storage["mttd_minutes"]["n"] == 0

    week47 = rows[("2026-W47", "compute")]
    assert week47["mttd_minutes"]["median"] == 30.0
    assert week47["isolation_minutes"]["median"] == 5.0
    assert week47["ticket_minutes"]["n"] == 0  # its ticket failed

    week48 = rows[("2026-W48", "all")]
    assert week48["incidents"] == 6
    every = want["mttd"] + history["week48_network"]["mttd"]
    assert week48["mttd_minutes"] == {"median": statistics.median(every), "p90": p90(every), "n": 4}
    tickets = want["ticket"] + history["week48_network"]["ticket"]
    assert week48["ticket_minutes"] == {"median": statistics.median(tickets), "p90": p90(tickets), "n": 4}
    # the seed's 19 min is an L4 incident's handling: compared with the L4 incidents' alone
    l4 = {"median": statistics.median(want["ticket"]), "p90": p90(want["ticket"]), "n": 3}
    assert week48["l4_ticket_minutes"] == l4
    assert rows[("all", "all")]["incidents"] == 7
    assert found["reference"] == {"mttd_minutes": 47.0, "l4_handling_minutes": 19.0}


def test_json_keys_and_the_table(history):
    found, rows = rows_of(history["dsn"], "--since", "14d")
    assert set(found) == {"since", "until", "reference", "definition", "rows"}
    assert all(set(row) == KEYS for row in found["rows"])
    assert found["until"].startswith("2026-11-26T12:00:00")
    assert rows[("all", "all")]["incidents"] == 7

    table = cli(history["dsn"], "--since", "14d")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split()[:3] == ["WEEK", "LAYER", "INCIDENTS"]
    compute = next(line for line in lines if line.startswith("2026-W48") and " compute " in line)
    assert "3.0 / 3.8 (3)" in compute  # MTTD 1, 3, 4: median 3, p90 3.8
    (seed,) = [line for line in lines if line.split()[:2] == ["seed", "reference"]]
    assert seed.index("47.0") == lines[0].index("MTTD min")  # each seed figure under its column
    assert seed.index("19.0") == lines[0].index("L4 TICKET min")
    assert "8.0 / 17.6 (3)" in compute  # L4 tickets 6, 8, 20: median 8, p90 17.6
    assert any("first evidence" in line for line in lines)  # the footer says what MTTD measures


def test_a_narrow_window_leaves_older_weeks_out(history):
    _, rows = rows_of(history["dsn"], "--since", "2026-11-23T00:00:00Z")
    assert ("2026-W47", "compute") not in rows
    assert rows[("all", "all")]["incidents"] == 6


def test_empty_store_says_so(tmp_dsn):
    with Store(tmp_dsn) as store:
        store.init_schema()
    done = cli(tmp_dsn)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("no incidents in the window")
    assert json.loads(cli(tmp_dsn, "--json").stdout)["rows"] == []


@pytest.mark.parametrize("since", ["bogus", "30x", "-3d"])
def test_bad_since_is_exit_2(tmp_dsn, since):
    done = cli(tmp_dsn, f"--since={since}")
    assert done.returncode == 2
    assert done.stderr.startswith(f"stethoscope: outcomes: --since {since!r}")
    assert "Traceback" not in done.stderr


def test_a_real_execute_run_is_measured(tmp_path, db):
    """`diagnose --execute` (a log action) on a worn SSD whose count crossed 100 two minutes before
    the evaluation: one storage incident of this week, MTTD 2 minutes, nothing isolated."""
    with Store(db) as store:
        worn(store, "node03")
        crossed = MetricColumns()
        crossed.append("node03", "smart_reallocated_sector_ct", "sda", {}, 60.0, AT - 4 * MIN)
        crossed.append("node03", "smart_reallocated_sector_ct", "sda", {}, 150.0, AT - 2 * MIN)
        store.insert_metrics(crossed)
    rule_dir = rules(tmp_path, [{"type": "log", "message": "{{ node_id }} worn"}])
    (finding,), _ = diagnose(tmp_path, db, rule_dir, *execute_args(tmp_path))
    assert finding["txn_id"]

    command = [
        sys.executable,
        "-m",
        "stethoscope.cli",
        "--dsn",
        db,
        "outcomes",
        "--json",
        "--rules",
        str(rule_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
    assert done.returncode == 0, done.stderr
    year, week, _ = dt.datetime.fromtimestamp(AT / 1000, tz=dt.UTC).isocalendar()
    rows = {(row["week"], row["layer"]): row for row in json.loads(done.stdout)["rows"]}
    storage = rows[(f"{year}-W{week:02d}", "storage")]
    assert storage["incidents"] == 1
    assert storage["mttd_minutes"] == {"median": 2.0, "p90": 2.0, "n": 1}
    assert storage["isolation_minutes"]["n"] == 0
    assert sorted(rows) == [
        (f"{year}-W{week:02d}", "all"),
        (f"{year}-W{week:02d}", "storage"),
        ("all", "all"),
    ]


def test_an_uninitialised_database_or_a_bad_until_is_exit_2(tmp_dsn):
    done = cli(tmp_dsn)
    assert done.returncode == 2
    assert "stethoscope db init" in done.stderr
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "outcomes", "--until", "2h"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("stethoscope: outcomes: --until '2h'")
