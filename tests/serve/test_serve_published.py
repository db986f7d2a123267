"""Beside a running serve, `diagnose` and `summary` answer from serve's last cycle (remediation.published)
when they would evaluate what it evaluates: on a busy controller they answer at once instead of
evaluating every rule again. They say so on stderr, print what their own dry run prints, and evaluate
themselves with --fresh, with other rules or inventory, or when serve's evaluation is stale."""

from __future__ import annotations

import json

import pytest
from test_execute import db, rules, worn
from test_serve_relay import _cli, serve

from stethoscope.remediation.cycle import CycleResult
from stethoscope.remediation.published import document, result_of
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

__all__ = ["db", "serve"]  # the fixtures
SERVES = "serve's evaluation of"


@pytest.fixture
def node03_worn(db):
    """Before serve's first cycle: it sees node03's SSD worn."""
    with Store(db) as store:
        worn(store, "node03", now_ms() - 5_000)


def test_diagnose_and_summary_beside_serve_answer_from_its_last_cycle(tmp_path, db, node03_worn, serve):
    with Store(db) as store:  # through serve's relay, after its cycle: its evaluation knows nothing of it
        worn(store, "node05", now_ms() - 5_000)
    given = ("--inventory", str(tmp_path / "serve-hosts.yml"), "--no-model")  # serve's inventory
    served = _cli(db, "diagnose", "--json", *given)
    assert served.returncode == 1 and SERVES in served.stderr, served.stderr
    assert "--fresh evaluates now" in served.stderr
    assert critical(served.stdout) == {"node03"}
    assert all("txn_id" not in f for f in json.loads(served.stdout))  # as a dry run prints them

    fresh = _cli(db, "diagnose", "--json", "--fresh", *given)
    assert fresh.returncode == 1 and SERVES not in fresh.stderr, fresh.stderr
    assert critical(fresh.stdout) == {"node03", "node05"}
    other_rules = _cli(db, "diagnose", "--json", "--rules", str(rules(tmp_path, None)), *given)
    assert SERVES not in other_rules.stderr, other_rules.stderr  # not what serve evaluates: evaluated here
    assert other_rules.returncode == 1, other_rules.stdout + other_rules.stderr
    assert critical(other_rules.stdout) == {"node03", "node05"}
    no_inventory = _cli(db, "diagnose", "--json", "--no-model")
    assert SERVES not in no_inventory.stderr  # every stored node, not serve's inventory's

    summary = _cli(db, "summary", *given)
    assert summary.returncode == 0 and SERVES in summary.stderr, summary.stderr
    assert "critical" in row(summary.stdout, "node03") and "critical" not in row(summary.stdout, "node05")
    fresh_summary = _cli(db, "summary", "--fresh", *given)
    assert "critical" in row(fresh_summary.stdout, "node05")


def critical(printed: str) -> set[str]:
    return {f["node_id"] for f in json.loads(printed) if f["severity"] == "critical"}


def row(printed: str, node: str) -> str:
    (line,) = [line for line in printed.splitlines() if line.startswith(f"{node} ")]
    return line


def test_a_stale_or_foreign_evaluation_is_not_taken():
    at = now_ms() - 10_000
    finding = {
        "finding_id": "f1", "rule_id": "r", "node_id": "node01", "device": "", "severity": "critical",
        "confidence": 1.0, "level": "L2", "first_seen": "", "message": "m", "evidence": "{}",
        "actions": ["log"], "outcome": "log ok", "txn_id": "t1",
    }  # fmt: skip
    published = document(CycleResult(at, [finding], 1, True), "key", 60.0)
    taken = result_of(json.loads(json.dumps(published)), "key", None, at + 10_000)
    assert taken is not None and taken.rules == 1 and not taken.executing
    (shown,) = taken.findings
    assert "outcome" not in shown and "txn_id" not in shown  # serve's actions are not a dry run's outcome
    assert result_of(published, "other key", None, at) is None
    assert result_of(published, "key", None, at + 2 * 60_000 + 30_000 + 1) is None  # two intervals and 30 s
    assert result_of({**published, "schema": 0}, "key", None, at) is None


def test_an_executor_that_judges_otherwise_is_not_taken_for_a_dry_run():
    """An executing serve that does not cap stream-only findings (stethoscope_stream_isolation) or
    that reads Alertmanager's silences judges findings as a dry run does not: its evaluation has
    another key, so diagnose evaluates itself."""
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.rules import load_rules
    from stethoscope.paths import rules_dir
    from stethoscope.remediation.published import evaluation_key

    rules = load_rules(rules_dir(), Catalog.load()).rules
    dry_run = evaluation_key(rules, ["node01"], {}, None, None)
    assert evaluation_key(rules, ["node01"], {}, None, None, {}) == dry_run
    judged = {"stethoscope_stream_isolation": True}
    assert evaluation_key(rules, ["node01"], {}, None, None, judged) != dry_run
