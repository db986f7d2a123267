"""Plain rules judged from one read per window (diagnosis/window_reads.py): a cycle on the swept lab
reads each window once, not each rule, and gives every shipped rule the matches its own query gives;
a series' labels read back from its labels_key whatever they hold; a window whose read fails, or an
aggregate that is not a number, sends its rules to their own queries with the same answer."""

from __future__ import annotations

import math

import pytest

from stethoscope.catalog import Catalog, default_catalog
from stethoscope.diagnosis import engine
from stethoscope.diagnosis.rules import load_rules
from stethoscope.diagnosis.shared_reads import units
from stethoscope.diagnosis.window_reads import labels_of, plain_rule, window_reads
from stethoscope.paths import project_root
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store, StoreError
from stethoscope.store.ttl import raw_ttl_seconds
from stethoscope.timeutil import now_ms

from conftest import swept_lab

CATALOG = Catalog.load()
AT = now_ms() - 60_000
GAUGE = "gpu_temperature_celsius"


def counted(store: Store, monkeypatch) -> list[str]:
    """The queries `store` runs from now on."""
    queries: list[str] = []
    real = store.query

    def query(sql, parameters=None):
        queries.append(sql)
        return real(sql, parameters)

    monkeypatch.setattr(store, "query", query)
    return queries


def rules_of(tmp_path, text: str):
    path = tmp_path / "rules.yml"
    path.write_text(text)
    loaded = load_rules(path, CATALOG)
    assert loaded.errors == []
    return loaded.rules


def test_a_cycle_on_the_swept_lab_reads_each_window_once_with_every_rules_own_matches(
    tmp_path, tmp_dsn, monkeypatch
):
    swept_lab(tmp_path, tmp_dsn)
    loaded = load_rules(project_root() / "rules", default_catalog())
    rules = loaded.rules
    at = now_ms()
    with Store(tmp_dsn) as store:
        ttl = raw_ttl_seconds(store)
        builder = engine.QueryBuilder(store.database, at, ttl)
        judged = [
            rule
            for unit in units(rules)
            if all(plain_rule(r, ttl, lambda c: builder.hourly_reads(c, builder.deep(c))) for r in unit)
            for rule in unit
        ]
        own_queries = [unit for unit in units(rules) if not all(rule in judged for rule in unit)]
        one_by_one = [engine.evaluate(store, rule, at) for rule in rules]
        queries = counted(store, monkeypatch)
        together = engine.evaluate_all(store, rules, at, readers=1, raw_ttl_seconds=ttl)
        rule_queries = [sql for sql in queries if f"{store.database}." in sql]
    assert together.failures == [] and together.matches == one_by_one
    assert sum(map(bool, together.matches)) >= 5  # the lab's faults: rules with matches to compare
    windows = window_reads(judged)
    assert len(judged) > len(rules) / 2 and len(windows) < 20
    # one read per window, one per rule (or family) of the others: not one per rule
    assert len(rule_queries) == len(windows) + len(own_queries) < len(units(rules)) / 2


def test_a_series_labels_read_back_from_its_labels_key_whatever_they_hold(store):
    labels = {
        "quote": "it's",
        "back\\slash": "a\\b",
        "lines": "one\ntwo\tthree\r",
        "ünï": "{}:,'",
        "empty": "",
        "nul": "\0\b\f",
    }
    batch = MetricColumns()
    batch.append("n1", GAUGE, "gpu0", labels, 50.0, AT)
    batch.append("n1", GAUGE, "gpu1", {}, 50.0, AT)
    store.insert_metrics(batch)
    keys = store.query(
        f"SELECT device, labels_key FROM {store.database}.metrics WHERE metric_name = {{m:String}} "
        "ORDER BY device",
        {"m": GAUGE},
    )
    assert [(device, labels_of(key)) for device, key in keys] == [("gpu0", labels), ("gpu1", {})]


def test_a_labelled_condition_selects_its_series_by_labels_the_key_holds(tmp_path, store):
    rules = rules_of(
        tmp_path,
        "- {rule_id: hot, description: t, severity: warning, when: {all: [{metric: gpu_temperature_celsius,"
        ' labels: {zone: "it\'s \\\\ hot"}, operator: ">", threshold: 80, window: 5m, aggregate: max}]}}\n',
    )
    batch = MetricColumns()
    batch.append("n1", GAUGE, "gpu0", {"zone": "it's \\ hot"}, 90.0, AT)
    batch.append("n2", GAUGE, "gpu0", {"zone": "cold"}, 90.0, AT)
    store.insert_metrics(batch)
    evaluation = engine.evaluate_all(store, rules, AT, readers=1)
    assert [[(m.node_id, m.value) for m in matches] for matches in evaluation.matches] == [[("n1", 90.0)]]
    assert evaluation.matches == [engine.evaluate(store, rules[0], AT)]


def test_a_window_whose_read_fails_sends_its_rules_to_their_own_queries(tmp_path, store, monkeypatch):
    rules = rules_of(
        tmp_path,
        "".join(
            f"- {{rule_id: r{t}, description: t, severity: warning, when: {{all: [{{metric: {GAUGE},"
            f' operator: ">", threshold: {t}, window: 5m, aggregate: avg}}]}}}}\n'
            for t in (40, 60)
        ),
    )
    batch = MetricColumns()
    for node, value in (("n1", 50.0), ("n2", 70.0)):
        batch.append(node, GAUGE, "gpu0", {}, value, AT)
    store.insert_metrics(batch)
    one_by_one = [engine.evaluate(store, rule, AT) for rule in rules]
    monkeypatch.setattr(engine.QueryBuilder, "window_read", lambda self, read: "SELECT no_such_column")
    queries = counted(store, monkeypatch)
    evaluation = engine.evaluate_all(store, rules, AT, readers=1)
    assert evaluation.failures == [] and evaluation.matches == one_by_one
    assert [len(m) for m in one_by_one] == [2, 1]
    assert sum("no_such_column" in sql for sql in queries) == 1 and len(queries) >= 3


def test_a_window_read_refused_by_a_store_that_stopped_answering_raises_its_error(
    tmp_path, store, monkeypatch
):
    rules = rules_of(
        tmp_path,
        f"- {{rule_id: hot, description: t, severity: warning, when: {{all: [{{metric: {GAUGE},"
        ' operator: ">", threshold: 80, window: 5m, aggregate: max}]}}\n',
    )
    monkeypatch.setattr(engine.QueryBuilder, "window_read", lambda self, read: "SELECT no_such_column")
    monkeypatch.setattr(Store, "answers", lambda self: False)  # the server is gone, not the read wrong
    with pytest.raises(StoreError, match="no_such_column"):
        engine.evaluate_all(store, rules, AT, readers=1)


def test_an_aggregate_that_is_not_a_number_is_left_to_the_rules_own_query(tmp_path, store, monkeypatch):
    rules = rules_of(
        tmp_path,
        f"- {{rule_id: moving, description: t, severity: warning, when: {{all: [{{metric: {GAUGE},"
        ' operator: "!=", threshold: 0, window: 5m, aggregate: avg}]}}\n',
    )
    # stored before entries refused non-finite values: inf and -inf average to NaN
    for offset, value in ((1000, "inf"), (0, "-inf")):
        store.command(
            f"INSERT INTO {store.database}.metrics (node_id, metric_name, device, labels, value, timestamp) "
            "SELECT 'n1', {m:String}, 'gpu0', map(), toFloat64({v:String}), "
            "fromUnixTimestamp64Milli({t:Int64}, 'UTC')",
            {"m": GAUGE, "v": value, "t": AT - offset},
        )
    one_by_one = [engine.evaluate(store, rule, AT) for rule in rules]
    assert math.isnan(one_by_one[0][0].value)  # NaN != 0: its own query matches, with NaN
    queries = counted(store, monkeypatch)
    evaluation = engine.evaluate_all(store, rules, AT, readers=1)
    assert evaluation.matches == [[]] and [f.stage for f in evaluation.failures] == ["aggregate"]
    assert "n1 gpu0 " in evaluation.failures[0].error and "nan" in evaluation.failures[0].error
    assert len([sql for sql in queries if f"{store.database}.metrics" in sql]) == 2  # the window's, its own
