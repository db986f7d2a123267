"""The rules read by several connections at once (engine.evaluate_all): the same matches in the same
order as one rule after another, on the lab as the real collect.yml stores it, every connection
serving some; connections closed after on every path; a rule whose query fails while the store
answers costs that rule only; a store that fails still fails with its message, without waiting for
the other rules; STETHOSCOPE_READERS sets how many."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from stethoscope.catalog import default_catalog
from stethoscope.diagnosis import engine
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import project_root
from stethoscope.store.client import SchemaMissing, Store
from stethoscope.store.schema import DEFAULT_RAW_TTL_DAYS
from stethoscope.timeutil import now_ms

from conftest import TOP, approximately, swept_lab


def shipped_rules():
    loaded = load_rules(project_root() / "rules", default_catalog())
    assert not loaded.errors
    return sorted(loaded.rules, key=lambda r: r.rule_id)


def own_query_rules(rules, at):
    """Of `rules`, those a cycle reads by their own query (not judged from a window's read)."""
    _, judged = engine.planned_reads("stethoscope", rules, at, DEFAULT_RAW_TTL_DAYS * 86400, None, "rollup")
    return [rule for rule in rules if rule not in judged]


@pytest.fixture
def opened(monkeypatch) -> list[Store]:
    """The handles `Store.reader` opens (the real ones), to see that they are closed."""
    handles: list[Store] = []
    real_reader = Store.reader

    def reader(self: Store) -> Store:
        handle = real_reader(self)
        real_query = handle.query

        def counted(sql, parameters=None):
            handle.queries += 1  # type: ignore[attr-defined]
            return real_query(sql, parameters)

        handle.queries = 0  # type: ignore[attr-defined]
        handle.query = counted  # type: ignore[method-assign]
        handles.append(handle)
        return handle

    monkeypatch.setattr(Store, "reader", reader)
    return handles


def test_two_readers_give_the_matches_of_one_rule_after_another_on_the_swept_lab(tmp_path, tmp_dsn, opened):
    swept_lab(tmp_path, tmp_dsn)
    rules = shipped_rules()
    at = now_ms()
    with Store(tmp_dsn) as store:
        one_by_one = [engine.evaluate(store, rule, at) for rule in rules]
        together = engine.evaluate_all(store, rules, at, readers=2)
        # an average or a slope a window's read sums in another order differs in its last bits
        assert approximately(together.matches) == approximately(one_by_one) and together.failures == []
        assert (
            sum(map(bool, together.matches)) >= 5
        )  # the lab's faults: several rules have matches to compare
        assert len(opened) == 1 and opened[0]._client is None  # the second handle, closed after
        assert opened[0].queries >= 5  # and it read its share of the rules
        assert store.query("SELECT 1") == [(1,)]  # the caller's own handle still open


def test_a_failing_rule_query_raises_the_stores_error_and_closes_the_readers(tmp_path, opened):
    store = Store(f"chdb://{tmp_path / 'db'}")  # no `db init`: no tables to read
    with store, pytest.raises(SchemaMissing, match="db init"):
        engine.evaluate_all(store, shipped_rules(), now_ms(), readers=3)
    assert len(opened) == 2 and all(handle._client is None for handle in opened)


def test_a_reader_that_cannot_open_closes_those_already_open_and_raises_the_stores_error(
    tmp_path, opened, monkeypatch
):
    from stethoscope.store.client import StoreError

    real_reader = Store.reader  # the counting spy of `opened`

    def second_fails(self: Store) -> Store:
        if len(opened) == 1:
            raise StoreError("ClickHouse at http://127.0.0.1:1: too many connections")
        return real_reader(self)

    monkeypatch.setattr(Store, "reader", second_fails)
    with Store(f"chdb://{tmp_path / 'db'}") as store:
        store.init_schema()
        with pytest.raises(StoreError, match="too many connections"):
            engine.evaluate_all(store, shipped_rules(), now_ms(), readers=3)
    assert len(opened) == 1 and opened[0]._client is None


@pytest.mark.parametrize("readers", [1, 2])
def test_a_rule_that_fails_while_the_store_answers_costs_that_rule_only(tmp_path, monkeypatch, readers):
    from stethoscope.store.client import StoreError

    rules = shipped_rules()
    real_matches = engine.rule_matches
    at = now_ms()
    failing = own_query_rules(rules, at)[3]  # a rule read by its own query, not judged from a window's

    def one_fails(store, rule, *args):
        if rule is failing:
            raise StoreError(
                f"embedded database x: {rule.rule_id}: Unexpected inf or nan to integer conversion"
            )
        return real_matches(store, rule, *args)

    monkeypatch.setattr(engine, "rule_matches", one_fails)
    with Store(f"chdb://{tmp_path / 'db'}") as store:
        store.init_schema()
        evaluation = engine.evaluate_all(store, rules, at, readers=readers)
    assert len(evaluation.matches) == len(rules) and evaluation.matches[rules.index(failing)] == []
    (failure,) = evaluation.failures
    assert failure.rule_id == failing.rule_id and "inf or nan" in failure.error
    assert failure.where == f"{failing.file}:{failing.line}"


def test_a_store_that_stops_answering_stops_the_rules_not_started_yet(tmp_path, monkeypatch):
    """Against a server that is gone, a cycle must not wait for every other rule first."""
    from stethoscope.store.client import StoreError

    rules = shipped_rules()
    started: list[str] = []
    failing = own_query_rules(rules, now_ms())[-1]  # read by its own query, the last of those

    def slow_or_failing(store, rule, *args):
        started.append(rule.rule_id)
        if rule is failing:
            raise StoreError(f"ClickHouse at http://127.0.0.1:1: {rule.rule_id}: timed out")
        time.sleep(0.2)
        return []

    monkeypatch.setattr(engine, "rule_matches", slow_or_failing)
    monkeypatch.setattr(Store, "answers", lambda self: False)  # the server is gone, not the rule wrong
    # the failing rule is the last of its kind in the rules' order and the first of them to be read
    # (the costliest; the windows' reads, on an empty store, go before it)
    monkeypatch.setattr(engine, "read_reach", lambda item: int(item is failing.when))
    with Store(f"chdb://{tmp_path / 'db'}") as store:
        store.init_schema()
        with pytest.raises(StoreError, match="timed out"):
            engine.evaluate_all(store, rules, now_ms(), readers=2)
    assert len(started) < len(own_query_rules(rules, now_ms())) // 2


@pytest.mark.parametrize(("value", "readers"), [("1", 1), ("3", 3), ("", None)])
def test_stethoscope_readers_sets_how_many_connections_read(monkeypatch, value, readers):
    monkeypatch.setenv(engine.READERS_VARIABLE, value)
    expected = readers if readers is not None else max(1, min(engine.MAX_READERS, engine.usable_cores()))
    assert engine.readers_wanted() == expected


def test_a_bad_stethoscope_readers_is_a_configuration_error_exit_2(tmp_path):
    env = {"STETHOSCOPE_READERS": "two", "STETHOSCOPE_DSN": f"chdb://{tmp_path / 'db'}", "PATH": "/usr/bin"}
    cli = [sys.executable, "-m", "stethoscope.cli", "diagnose"]
    done = subprocess.run(cli, env=env, cwd=TOP, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "STETHOSCOPE_READERS='two'" in done.stderr and "Traceback" not in done.stderr
