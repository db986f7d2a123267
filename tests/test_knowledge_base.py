"""Every shipped rule: data that fires it and data that must not; the rule folder itself is valid;
`stethoscope diagnose` prints findings and exits by --fail-on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stethoscope.batch import MetricColumns
from stethoscope.catalog import Catalog
from stethoscope.engine import evaluate
from stethoscope.rules import load_rules
from stethoscope.store import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

CATALOG = Catalog.load()
LOADED = load_rules(TOP / "rules", CATALOG)
RULES = {rule.rule_id: rule for rule in LOADED.rules}
AT = now_ms() - 30_000


def put(store, node, device, **series):
    batch = MetricColumns()
    for metric, values in series.items():
        for index, value in enumerate(values):
            batch.append(node, metric, device, {}, float(value), AT - (len(values) - 1 - index) * 60_000)
    store.insert_metrics(batch)


# rule -> (device, series that fire it, series that must not)
CASES = {
    "gpu_row_remap_pending": (
        "gpu0",
        {"gpu_remapped_rows_pending": [0, 1]},
        {"gpu_remapped_rows_pending": [1, 0]},
    ),
    "gpu_row_remap_failure": ("gpu0", {"gpu_remapping_failure": [1]}, {"gpu_remapping_failure": [0, 0]}),
    "ib_port_not_active": ("mlx5_0/1", {"ib_port_state": [1, 1, 1]}, {"ib_port_state": [4, 1, 4]}),
    "ssd_reallocated_sectors": (
        "sda",
        {"smart_reallocated_sector_ct": [120], "smart_media_wearout_indicator_normalized": [8]},
        {"smart_reallocated_sector_ct": [120], "smart_media_wearout_indicator_normalized": [55]},
    ),
}


def test_the_shipped_rules_are_valid_and_each_has_cases():
    assert LOADED.errors == [] and set(RULES) == set(CASES)


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_fires_and_does_not(store, rule_id):
    device, firing, quiet = CASES[rule_id]
    put(store, "bad", device, **firing)
    put(store, "good", device, **quiet)
    assert [(m.node_id, m.device) for m in evaluate(store, RULES[rule_id], AT)] == [("bad", device)]


def test_diagnose_cli_json_and_exit_codes(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    with Store(dsn) as store:
        store.init_schema()
        put(store, "node04", "gpu0", gpu_remapped_rows_pending=[1])
    run = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "diagnose", "--json"]
    warning = subprocess.run(run, capture_output=True, text=True, cwd=TOP, check=False)
    assert warning.returncode == 0  # a warning is below the default --fail-on critical
    (finding,) = json.loads(warning.stdout)
    assert {k: finding[k] for k in ("rule_id", "node_id", "device", "severity", "level")} == {
        "rule_id": "gpu_row_remap_pending",
        "node_id": "node04",
        "device": "gpu0",
        "severity": "warning",
        "level": "L2",
    }
    assert set(finding) == {
        "finding_id",
        "rule_id",
        "node_id",
        "device",
        "severity",
        "confidence",
        "level",
        "first_seen",
        "message",
        "evidence",
        "actions",
    }
    assert finding["message"] == "node04 gpu0: row remap pending, schedule a GPU reset when idle"
    strict = subprocess.run(
        [*run, "--fail-on", "warning"], capture_output=True, text=True, cwd=TOP, check=False
    )
    assert strict.returncode == 1
