"""The raw TTL the rules read by is the store's own (`db init --ttl-days N`), read once per cycle: a
window longer than it reads the daily rollup, whose rows outlive the raw ones.

With a 3-day TTL the engine once assumed 30 days: a 7-day `last` window over a sample 5 days old read
the raw rows, which the TTL had already removed, and found nothing."""

from __future__ import annotations

import textwrap
import uuid

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate, evaluate_all
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.ttl import raw_ttl_days
from stethoscope.timeutil import now_ms

CATALOG = Catalog.load()
DAY_MS = 86_400_000
AT = now_ms() - 60_000
TTL_DAYS = 3


@pytest.fixture
def short_lived(tmp_dsn: str):
    """A store made with `db init --ttl-days 3`, holding one sample 5 days old: 95 °C on n1's gpu0."""
    with Store(tmp_dsn, f"t_{uuid.uuid4().hex[:8]}") as store:
        store.init_schema(TTL_DAYS)
        batch = MetricColumns()
        batch.append("n1", "gpu_temperature_celsius", "gpu0", {}, 95.0, AT - 5 * DAY_MS)
        store.insert_metrics(batch)
        yield store


def last_of_a_week(tmp_path):
    path = tmp_path / "rule.yml"
    path.write_text(
        textwrap.dedent(
            """
            rule_id: hot_within_a_week
            description: the last temperature of the week is hot
            severity: warning
            trigger:
              - {metric: gpu_temperature_celsius, operator: ">", threshold: 90, window: 7d, aggregate: last}
            """
        )
    )
    result = load_rules(path, CATALOG)
    assert result.errors == []
    return result.rules[0]


def test_the_store_says_its_raw_ttl(short_lived):
    assert raw_ttl_days(short_lived) == TTL_DAYS


def test_a_window_past_a_short_raw_ttl_reads_the_rollup_through_evaluate_all(tmp_path, short_lived):
    rule = last_of_a_week(tmp_path)
    said = [(m.node_id, m.value) for m in evaluate(short_lived, rule, AT, raw_ttl_seconds=TTL_DAYS * 86400)]
    assert said == [("n1", 95.0)]
    (matches,) = evaluate_all(short_lived, [rule], AT, readers=1).matches
    assert [(m.node_id, m.value) for m in matches] == said
    assert [(m.node_id, m.value) for m in evaluate(short_lived, rule, AT)] == said


def test_a_window_past_a_short_raw_ttl_is_a_finding_of_diagnose(tmp_path, short_lived):
    rule = last_of_a_week(tmp_path)
    findings = diagnose(short_lived, [rule], AT)
    assert [(f["rule_id"], f["node_id"], f["value"]) for f in findings] == [("hot_within_a_week", "n1", 95.0)]
