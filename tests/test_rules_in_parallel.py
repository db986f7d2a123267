"""The rules read by several threads, each on a handle of its own: the same matches in the same order
as one rule after another, on the lab as the real collect.yml stores it; handles closed after; a
query that fails still fails with the store's message."""

from __future__ import annotations

import pytest

from stethoscope.catalog import default_catalog
from stethoscope.diagnosis import engine
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import project_root
from stethoscope.store.client import SchemaMissing, Store
from stethoscope.timeutil import now_ms

from conftest import swept_lab


def shipped_rules():
    loaded = load_rules(project_root() / "rules", default_catalog())
    assert not loaded.errors
    return sorted(loaded.rules, key=lambda r: r.rule_id)


@pytest.fixture
def opened(monkeypatch) -> list[Store]:
    """The handles `Store.reader` opens (the real ones), to see that they are closed."""
    handles: list[Store] = []
    real_reader = Store.reader

    def reader(self: Store) -> Store:
        handles.append(real_reader(self))
        return handles[-1]

    monkeypatch.setattr(Store, "reader", reader)
    return handles


def test_two_readers_give_the_matches_of_one_rule_after_another_on_the_swept_lab(tmp_path, tmp_dsn, opened):
    swept_lab(tmp_path, tmp_dsn)
    rules = shipped_rules()
    at = now_ms()
    with Store(tmp_dsn) as store:
        one_by_one = [engine.evaluate(store, rule, at) for rule in rules]
        together = engine.evaluate_all(store, rules, at, readers=2)
        assert together == one_by_one
        assert sum(map(bool, together)) >= 5  # the lab's faults: several rules have matches to compare
        assert len(opened) == 1 and opened[0]._client is None  # the second handle, closed after
        assert store.query("SELECT 1") == [(1,)]  # the caller's own handle still open


def test_a_failing_rule_query_raises_the_stores_error_and_closes_the_readers(tmp_path, opened):
    store = Store(f"chdb://{tmp_path / 'db'}")  # no `db init`: no tables to read
    with store, pytest.raises(SchemaMissing, match="db init"):
        engine.evaluate_all(store, shipped_rules(), now_ms(), readers=3)
    assert len(opened) == 2 and all(handle._client is None for handle in opened)
