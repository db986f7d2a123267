"""Rules that share their read (diagnosis/shared_reads.py): the shipped XID rules, one per `xid` label
over the same 15 minutes of gpu_xid_errors_total, are read in one query by a cycle and give each
rule the matches it gives read on its own; so a family of every operator and label, whether the
cycle judges it from its window's read (diagnosis/window_reads.py) or reads it by the family's query
(`judged` False: the query a cycle makes where no window's read answers, e.g. `via="raw"`)."""

from __future__ import annotations

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis import engine
from stethoscope.diagnosis.rules import load_rules
from stethoscope.diagnosis.shared_reads import units
from stethoscope.paths import project_root
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

CATALOG = Catalog.load()
AT = now_ms() - 60_000
XID = "gpu_xid_errors_total"


def xid_rules():
    loaded = load_rules(project_root() / "rules" / "gpu" / "xid.yml", CATALOG)
    assert loaded.errors == []
    return [rule for rule in loaded.rules if rule.rule_id.startswith("gpu_xid_") and rule.metrics == [XID]]


def counts(store, node, device, xid, values, minutes=1):
    batch = MetricColumns()
    for index, value in enumerate(values):  # `minutes` apart, the last at AT
        at = AT - (len(values) - 1 - index) * minutes * 60_000
        batch.append(node, XID, device, {"xid": xid}, float(value), at)
    store.insert_metrics(batch)


def reads_of(store, monkeypatch, metric):
    """The queries `store` runs that read `metric`, from now on."""
    reads: list[str] = []
    real = store.query

    def counted(sql, parameters=None):
        named = [] if parameters is None else parameters.values()
        if any(value == metric or (isinstance(value, list) and metric in value) for value in named):
            reads.append(sql)
        return real(sql, parameters)

    monkeypatch.setattr(store, "query", counted)
    return reads


def family_query(monkeypatch, judged: bool) -> None:
    """Unless `judged`, no rule is judged from a window's read: the family's own query reads it."""
    if not judged:
        monkeypatch.setattr(engine, "plain_rule", lambda *_: False)


@pytest.mark.parametrize("judged", [True, False])
def test_the_xid_rules_are_one_read_that_gives_each_rule_its_own_matches(store, monkeypatch, judged):
    rules = xid_rules()
    assert len(rules) > 10 and [len(unit) for unit in units(rules)] == [len(rules)]
    # series as the sweep's kernel-log parser makes them: one appears with the first XID of its number
    counts(store, "n1", "gpu0", "79", [1])  # fell off the bus: news inside the window
    counts(store, "n2", "gpu3", "48", [2, 3, 3], minutes=10)  # one more inside the 15 minutes
    counts(store, "n2", "gpu5", "48", [1, 1, 1], minutes=10)  # old news
    counts(store, "n3", "gpu1", "13", [4, 9])  # an application's XID: no rule of these names it
    one_by_one = [engine.evaluate(store, rule, AT) for rule in rules]
    family_query(monkeypatch, judged)
    reads = reads_of(store, monkeypatch, XID)
    evaluation = engine.evaluate_all(store, rules, AT, readers=1)
    assert len(reads) == 1 and ("metric_name IN {metrics:Array(String)}" in reads[0]) == judged
    assert evaluation.failures == []
    assert evaluation.matches == one_by_one
    fired = {
        rule.rule_id: [(m.node_id, m.device, m.value) for m in matches]
        for rule, matches in zip(rules, evaluation.matches, strict=True)
        if matches
    }
    assert fired == {"gpu_xid_79": [("n1", "gpu0", 1.0)], "gpu_xid_48": [("n2", "gpu3", 1.0)]}


GAUGE = "gpu_temperature_celsius"
OPERATORS = [(">", 50), (">=", 60), ("<", 20), ("<=", 10), ("==", 42), ("!=", 42)]


def labelled_rules(tmp_path, window="10m"):
    """One rule per operator and `sensor` label (a, b and the empty value): one family."""
    text = ""
    for sensor in ("a", "b", ""):
        for index, (operator, threshold) in enumerate(OPERATORS):
            condition = (
                f"{{metric: {GAUGE}, labels: {{sensor: '{sensor}'}}, operator: '{operator}', "
                f"threshold: {threshold}, window: {window}, aggregate: max}}"
            )
            text += f"- {{rule_id: r{index}_{sensor or 'empty'}, description: t, severity: warning, "
            text += f"when: {{all: [{condition}]}}}}\n"
    path = tmp_path / "family.yml"
    path.write_text(text)
    loaded = load_rules(path, CATALOG)
    assert loaded.errors == []
    return loaded.rules


def temperatures(store):
    """Four nodes, a GPU and its memory as two devices of one enclosing GPU (sensor b at 42 on both:
    ties), series of every label set the rules name and one with a label more."""
    values = [5, 10, 15, 42, 42, 55, 60, 70]
    batch = MetricColumns()
    step = 0
    for n in range(4):
        for gpu in range(2):
            for device in (f"gpu{gpu}", f"gpu{gpu}/mem"):
                for labels in ({"sensor": "a"}, {"sensor": "b"}, {}, {"sensor": "a", "x": "1"}):
                    for minute in range(3):
                        step += 7
                        tied = labels == {"sensor": "b"} or (device.endswith("mem") and minute == 0)
                        value = 42 if tied else values[step % len(values)]
                        batch.append(f"n{n}", GAUGE, device, labels, float(value), AT - minute * 60_000)
    store.insert_metrics(batch)


@pytest.mark.parametrize("judged", [True, False])
def test_a_family_of_every_operator_and_label_gives_each_rule_its_own_matches(
    tmp_path, store, monkeypatch, judged
):
    rules = labelled_rules(tmp_path)
    assert [len(unit) for unit in units(rules)] == [len(rules)]
    temperatures(store)
    for at, nodes in ((AT, None), (AT - 90_000, ["n1", "n2"])):  # now, and a past instant of two nodes
        one_by_one = [engine.evaluate(store, rule, at, nodes=nodes) for rule in rules]
        family_query(monkeypatch, judged)
        reads = reads_of(store, monkeypatch, GAUGE)
        evaluation = engine.evaluate_all(store, rules, at, nodes=nodes, readers=1)
        monkeypatch.undo()
        assert len(reads) == 1 and evaluation.failures == []
        assert ("metric_name IN {metrics:Array(String)}" in reads[0]) == judged
        assert evaluation.matches == one_by_one
        assert sum(1 for matches in one_by_one if matches) >= 9  # most rules match something
        tied = evaluation.matches[[rule.rule_id for rule in rules].index("r4_b")]  # == 42 on both devices
        assert tied and all(match.device.endswith("/mem") for match in tied)  # the last by name


def test_a_family_past_the_raw_ttl_is_read_rule_by_rule_with_the_same_answer(tmp_path, tmp_dsn, monkeypatch):
    rules = labelled_rules(tmp_path, window="3d")
    with Store(tmp_dsn, "short") as store:
        store.init_schema(raw_ttl_days=2)  # the 3 days read the daily rollup
        temperatures(store)
        one_by_one = [engine.evaluate(store, rule, AT) for rule in rules]
        reads = reads_of(store, monkeypatch, GAUGE)
        evaluation = engine.evaluate_all(store, rules, AT, readers=1)
        assert len(reads) == len(rules) and evaluation.failures == []
        assert evaluation.matches == one_by_one and any(one_by_one)


def test_a_family_whose_query_the_store_refuses_fails_each_member_with_its_error(
    tmp_path, store, monkeypatch
):
    """A device glob pasted with a Unicode hyphen: ClickHouse refuses the pattern, for the family's
    read as for each rule's; each member is a RuleFailure of its own file:line, read once."""
    condition = (
        '{metric: nvme_percentage_used, operator: ">", threshold: %d, window: 5m, aggregate: last, '
        'device: "nvme‐*"}'
    )
    path = tmp_path / "pasted.yml"
    path.write_text(
        "".join(
            f"- {{rule_id: worn_{t}, description: t, severity: warning, when: {{all: [{condition % t}]}}}}\n"
            for t in (80, 90)
        )
    )
    rules = load_rules(path, CATALOG).rules
    assert [len(unit) for unit in units(rules)] == [2]
    reads = reads_of(store, monkeypatch, "nvme_percentage_used")
    evaluation = engine.evaluate_all(store, rules, AT, readers=1)
    assert len(reads) == 1 and evaluation.matches == [[], []]
    assert [(f.rule_id, f.where, f.stage) for f in evaluation.failures] == [
        ("worn_80", f"{path}:1", "query"),
        ("worn_90", f"{path}:2", "query"),
    ]
    assert all("Code:" in failure.error for failure in evaluation.failures)
