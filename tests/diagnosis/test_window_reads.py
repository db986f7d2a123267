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

from conftest import approximately, swept_lab

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
    assert together.failures == [] and approximately(together.matches) == approximately(one_by_one)
    # the lab's faults: judged rules with matches to compare
    assert (
        sum(1 for rule, matches in zip(rules, together.matches, strict=True) if matches and rule in judged)
        >= 3
    )
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


DIFFERENTIAL_RULES = """
- {rule_id: hot_any_link, description: t, severity: warning, when: {any: [
    {metric: gpu_temperature_celsius, operator: ">", threshold: 70, window: 5m, aggregate: max},
    {metric: nvlink_error_rate_percent, operator: ">=", threshold: 2, window: 5m, aggregate: avg}]}}
- {rule_id: cold_and_still, description: t, severity: warning, when: {all: [
    {metric: gpu_temperature_celsius, operator: "<=", threshold: 45, window: 10m, aggregate: last},
    {metric: gpu_temperature_celsius, operator: "<", threshold: 40, window: 5m, aggregate: min}]}}
- {rule_id: links_quiet, description: t, severity: warning, when: {all: [
    {metric: nvlink_error_rate_percent, operator: "<", threshold: 2, window: 5m, aggregate: min}]}}
- {rule_id: nested, description: t, severity: warning, when: {all: [
    {any: [{metric: gpu_temperature_celsius, operator: "!=", threshold: 50, window: 5m, aggregate: last},
           {metric: nvlink_replay_errors_total, operator: ">", threshold: 2, window: 10m, aggregate: delta}]},
    {metric: nvlink_error_rate_percent, operator: ">", threshold: 0, window: 10m, aggregate: max,
     min_samples: 3}]}}
- {rule_id: bits, description: t, severity: warning, when: {all: [
    {metric: gpu_throttle_reasons_active, operator: has_bits, threshold: 8, without_bits: 64,
     window: 5m, aggregate: last}]}}
- {rule_id: zone_empty, description: t, severity: warning, when: {all: [
    {metric: gpu_temperature_celsius, labels: {zone: ""}, operator: ">", threshold: 60, window: 5m,
     aggregate: avg}]}}
- {rule_id: zone_b_links, description: t, severity: warning, when: {all: [
    {metric: nvlink_error_rate_percent, labels: {zone: b}, device: "gpu1/*", operator: ">", threshold: 1,
     window: 5m, aggregate: max}]}}
- {rule_id: xid_news, description: t, severity: warning, when: {all: [
    {metric: gpu_xid_errors_total, operator: ">", threshold: 0, window: 10m, aggregate: delta}]}}
- {rule_id: replay_rate, description: t, severity: warning, when: {all: [
    {metric: nvlink_replay_errors_total, operator: ">", threshold: 0.001, window: 10m, aggregate: rate}]}}
- {rule_id: slope_cv, description: t, severity: warning, when: {any: [
    {metric: gpu_temperature_celsius, operator: ">", threshold: 5, window: 10m, aggregate: slope},
    {metric: gpu_temperature_celsius, operator: ">", threshold: 0.2, window: 10m, aggregate: cv}]}}
"""


@pytest.mark.parametrize("seed", range(4))
def test_random_fleets_get_from_window_reads_the_matches_each_rules_own_query_gives(tmp_path, store, seed):
    """Ties, nested groups naming a metric twice, links under their GPU, has_bits, an empty label
    against a missing one, device globs, sample counts, counters and events: random data, seeded."""
    rules = rules_of(tmp_path, DIFFERENTIAL_RULES)
    plan = engine.planned_reads(store.database, rules, AT, raw_ttl_seconds(store), None, "rollup")
    assert plan[1] == rules  # every rule here is judged from a window's read
    random = __import__("random").Random(seed)
    batch = MetricColumns()
    for node in (f"n{i}" for i in range(6)):
        for gpu in range(3):
            labels = random.choice([{}, {"zone": ""}, {"zone": "a"}, {"zone": "b"}])
            for minute in range(random.randint(1, 12)):
                at = AT - minute * 60_000 - random.randint(0, 3) * 1000
                batch.append(
                    node, GAUGE, f"gpu{gpu}", labels, float(random.choice([35, 40, 50, 50, 71, 90])), at
                )
                batch.append(
                    node,
                    "gpu_throttle_reasons_active",
                    f"gpu{gpu}",
                    {},
                    float(random.choice([0, 8, 72, 9])),
                    at,
                )
                for link in range(2):
                    rate = float(random.choice([0, 0, 1, 2, 2, 3]))
                    batch.append(node, "nvlink_error_rate_percent", f"gpu{gpu}/link{link}", labels, rate, at)
            count = float(random.choice([1, 7, 120]))  # a counter starts at its first value
            for minute in reversed(range(random.randint(0, 20))):
                count += (
                    random.choice([0, 0, 1, 3]) if random.random() > 0.1 else -count
                )  # a reset now and then
                at = AT - minute * 60_000
                batch.append(node, "nvlink_replay_errors_total", f"gpu{gpu}/link0", {}, count, at)
                batch.append(node, "gpu_xid_errors_total", f"gpu{gpu}", {"xid": "79"}, count, at)
    store.insert_metrics(batch)
    for nodes in (None, ["n1", "n3", "n4"]):
        one_by_one = [engine.evaluate(store, rule, AT, nodes=nodes) for rule in rules]
        together = engine.evaluate_all(store, rules, AT, nodes=nodes, readers=2)
        assert together.failures == [] and approximately(together.matches) == approximately(one_by_one)
    assert sum(map(bool, one_by_one)) >= 3  # the rules have matches to compare


@pytest.mark.parametrize(("cores", "readers", "threads"), [(2, 2, 1), (8, 2, 4), (2, 1, None)])
@pytest.mark.parametrize("judged", [True, False])
def test_a_cycle_shares_the_cores_among_its_readers(
    tmp_path, store, monkeypatch, cores, readers, threads, judged
):
    """Two readers on two cores: each query one thread (ClickHouse's own on top only contend); one
    reader: ClickHouse's default. Every shape of query takes it: the window reads, and (`judged`
    False) each rule's own, the XID family's and a correlated rule's."""
    rules = rules_of(tmp_path, DIFFERENTIAL_RULES)
    if not judged:
        monkeypatch.setattr(engine, "plain_rule", lambda *_: False)
        shipped = load_rules(project_root() / "rules", default_catalog()).rules
        rules += [rule for rule in shipped if rule.rule_id.startswith("gpu_xid_") or rule.correlate_by]
    seen: list[str] = []
    real = Store.query

    def query(self, sql, parameters=None):
        seen.append(sql)
        return real(self, sql, parameters)

    monkeypatch.setattr(Store, "query", query)
    monkeypatch.setattr(engine, "usable_cores", lambda: cores)
    evaluation = engine.evaluate_all(store, rules, AT, readers=readers)
    assert evaluation.failures == [] and engine.QUERY_THREADS.get() is None  # nothing left set here
    reads = [sql for sql in seen if f"{store.database}.metrics" in sql]
    assert len(reads) >= (3 if judged else 10)
    assert all(sql.endswith(f" SETTINGS max_threads = {threads}") == bool(threads) for sql in reads)
    assert all(("max_threads" in sql) == bool(threads) for sql in reads)


def test_a_servers_store_keeps_its_own_threads():
    """A server's cores are not the controller's, and a `readonly` user refuses a query's SETTINGS."""
    assert engine.query_threads("http://clickhouse:8123", 2, 2) is None
    assert engine.query_threads("chdb:///var/lib/stethoscope/db", 2, 2) == 1
