"""Beside a running serve, `diagnose` and `summary` answer from serve's last cycle (remediation.published)
when they would evaluate what it evaluates: on a busy controller they answer at once instead of
evaluating every rule again. They say so on stderr, print what their own dry run prints, and evaluate
themselves with --fresh, with other rules or inventory, or when serve's evaluation is stale."""

from __future__ import annotations

import json
import os

import pytest
from test_execute import db, rules, worn
from test_serve_relay import _cli, serve, serving

from stethoscope.diagnosis.rules import rule_files
from stethoscope.diagnosis.ruleset import RuleSet
from stethoscope.paths import rules_dir
from stethoscope.remediation.cycle import CycleResult
from stethoscope.remediation.published import Identity, document, result_of, sources_digest
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


def test_beside_serve_a_read_from_serves_files_loads_none_of_them(tmp_path, db, node03_worn, serve):
    """A command given serve's inventory, rules and model takes serve's evaluation by a digest of those
    files, parsing none of them: the inventory through Ansible, the rules through Jinja2, the model
    through onnxruntime were most of such a read's CPU on a controller serve keeps busy. An inventory
    edited since serve read it is not serve's: evaluated here."""
    inventory = tmp_path / "serve-hosts.yml"
    given = ("--inventory", str(inventory), "--no-model")
    for command in (("diagnose", "--json"), ("summary",)):
        done = _cli(db, *command, *given, env={"PYTHONPROFILEIMPORTTIME": "1"})
        assert SERVES in done.stderr, done.stderr[-2000:]
        assert done.returncode == (1 if command[0] == "diagnose" else 0)
        assert not imported(done.stderr) & {"ansible", "jinja2", "onnxruntime"}, command
    assert critical(_cli(db, "diagnose", "--json", *given).stdout) == {"node03"}
    assert "critical" in row(_cli(db, "summary", *given).stdout, "node03")

    elsewhere = tmp_path / "elsewhere" / "hosts.yml"  # the same hosts and settings from another file:
    elsewhere.parent.mkdir()  # loaded, compared by what they evaluate, and taken
    elsewhere.write_text(inventory.read_text())
    compared = _cli(db, "diagnose", "--json", "--inventory", str(elsewhere), "--no-model")
    assert SERVES in compared.stderr and critical(compared.stdout) == {"node03"}, compared.stderr

    inventory.write_text(inventory.read_text() + "    node99: {stethoscope_node_key: 99}\n")
    edited = _cli(db, "diagnose", "--json", *given)
    assert edited.returncode == 1 and SERVES not in edited.stderr, edited.stderr


def test_beside_serve_running_the_model_a_read_takes_its_state_with_the_evaluation(tmp_path, db, node03_worn):
    """The model's name, level and what it could not classify come with serve's evaluation: printed as
    a fresh evaluation prints them, without onnxruntime loaded."""
    given = ("--inventory", str(tmp_path / "serve-hosts.yml"))
    with serving(tmp_path, db):
        served = _cli(db, "diagnose", *given, env={"PYTHONPROFILEIMPORTTIME": "1"})
        fresh = _cli(db, "diagnose", "--fresh", *given)
    assert SERVES in served.stderr and SERVES not in fresh.stderr, served.stderr[-2000:]
    assert not imported(served.stderr) & {"ansible", "jinja2", "onnxruntime"}
    assert served.returncode == fresh.returncode == 1, fresh.stderr
    assert served.stdout.splitlines()[0] == fresh.stdout.splitlines()[0]  # the findings and the model


def imported(importtime: str) -> set[str]:
    """The top-level packages a `-X importtime` log names."""
    lines = [line for line in importtime.splitlines() if line.startswith("import time:")]
    return {line.rpartition("|")[2].strip().split(".")[0] for line in lines}


def test_the_sources_digest_follows_the_files_and_refuses_what_files_cannot_say(tmp_path):
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    node01:\n")
    first = sources_digest("stethoscope", inventory, rules_dir(), None, [])
    assert first is not None and first == sources_digest("stethoscope", inventory, rules_dir(), None, [])
    (inventory / "group_vars" / "all.yml").write_text("stethoscope_sweep_interval: 600\n")
    settings = sources_digest("stethoscope", inventory, rules_dir(), None, [])
    assert settings not in (None, first)
    warmup = ["stethoscope_job_warmup=10m"]
    assert sources_digest("stethoscope", inventory, rules_dir(), None, warmup) not in (None, settings)
    ticket = ["stethoscope_ticket_url=http://127.0.0.1:9/"]  # the executor's: no finding changes
    assert sources_digest("stethoscope", inventory, rules_dir(), None, ticket) == settings
    one_rule = rule_files(rules_dir())[0]
    assert sources_digest("stethoscope", inventory, one_rule, None, []) not in (None, settings)

    plugin = inventory / "cloud.aws_ec2.yml"  # an inventory plugin's hosts come from elsewhere
    plugin.write_text("plugin: amazon.aws.aws_ec2\nregions: [eu-west-1]\n")
    assert sources_digest("stethoscope", inventory, rules_dir(), None, []) is None
    plugin.unlink()
    script = inventory / "cmdb.py"  # and a script's from whatever it prints
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    assert sources_digest("stethoscope", inventory, rules_dir(), None, []) is None
    script.unlink()
    assert sources_digest("stethoscope", inventory, rules_dir(), None, []) == settings
    assert sources_digest("stethoscope", inventory, rules_dir(), None, ["=x"]) != settings  # refused: exit 2
    assert sources_digest("other", inventory, rules_dir(), None, []) != settings  # another database's
    shared = tmp_path / "shared"
    shared.mkdir()
    (inventory / "group_vars" / "gpu").symlink_to(shared)  # Ansible follows it; a digest of files would not
    assert sources_digest("stethoscope", inventory, rules_dir(), None, []) is None
    assert sources_digest("stethoscope", tmp_path / "absent", rules_dir(), None, []) is None


def test_a_rule_set_holding_a_bad_edit_is_not_its_files(tmp_path):
    """serve keeps a bad edit's last good rules: its evaluation is then not what its files say, and it
    publishes no sources digest (a command beside it loads the files and says what is wrong)."""
    from stethoscope.catalog import Catalog

    path = tmp_path / "rules"
    path.mkdir()
    good = rule_files(rules_dir())[0].read_text()
    (path / "a.yml").write_text(good)
    rules = RuleSet(path, Catalog.load())
    rules.refresh()
    assert rules.rules and rules.as_files
    (path / "a.yml").write_text(good + "\n- {rule_id: broken}\n")
    rules.refresh()
    assert rules.rules and not rules.as_files
    (path / "a.yml").write_text(good)
    rules.refresh()
    assert rules.as_files
    same_size = good.replace("level: L", "level: X", 1)  # same size, and the time put back
    stamp = (path / "a.yml").stat()
    (path / "a.yml").write_text(same_size)
    os.utime(path / "a.yml", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    rules.refresh()
    assert not rules.as_files  # read, and refused: never the old rules under the new text's digest
    (path / "a.yml").write_text("---\n[]\n")
    rules.refresh()
    assert not rules.rules and not rules.as_files  # no rule: a command loading them exits 2


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
    published = document(CycleResult(at, [finding], 1, True), Identity("key"), 60.0)
    assert published["acting"] is True  # said beside it: the dry run printed is what serve acts on
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
