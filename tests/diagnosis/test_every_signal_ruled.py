"""Every health signal is ruled or declared (docs/design.md "Metric catalog"): each metric of
rules/metrics.yml is read by a shipped rule or a model feature, or says in `informational` why no rule
reads it. A metric added without either fails here: a signal nobody reads is a fault nobody is told."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from lab import Profile, ibv_devinfo

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_rdma
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context
from ansible_collections.aicluster.stethoscope.plugins.module_utils.smartctl import (
    parse_smartctl_json,
    smart_metrics,
)
from stethoscope.catalog import Catalog, CatalogError
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.batch import MetricColumns
from stethoscope.timeutil import now_ms

from conftest import FIXTURES, TOP, fixture_text

CATALOG = Catalog.load()
LOADED = load_rules(TOP / "rules", CATALOG)


def rule(rule_id: str):
    (found,) = [r for r in LOADED.rules if r.rule_id == rule_id]
    return found


def read_by_rules(rules_dir: Path, catalog: Catalog) -> dict[str, list[str]]:
    """metric -> the shipped rules (every condition of trigger and when) and models reading it."""
    loaded = load_rules(rules_dir, catalog)
    assert loaded.errors == []
    readers: dict[str, list[str]] = {}
    for rule in loaded.rules:
        for metric in rule.metrics:
            readers.setdefault(metric, []).append(rule.rule_id)
    for model in sorted((rules_dir / "models").glob("*.json")):
        for feature in json.loads(model.read_text())["features"]:
            readers.setdefault(feature["metric"], []).append(f"model {model.stem}")
    return readers


def unexplained(catalog: Catalog, readers: dict[str, list[str]]) -> list[str]:
    """Catalog names (metrics and families) that no rule or model reads and that give no reason."""
    entries = {**catalog.metrics, **catalog.families}
    return sorted(name for name, spec in entries.items() if name not in readers and not spec.informational)


def test_every_catalog_metric_is_read_by_a_rule_or_says_why_not():
    missing = unexplained(CATALOG, read_by_rules(TOP / "rules", CATALOG))
    assert missing == [], (
        "neither read by a shipped rule (rules/**/*.yml, rules/models/*.json) nor declared "
        f'`informational: "<reason>"` in rules/metrics.yml: {missing}'
    )


def test_no_metric_a_rule_reads_is_declared_informational():
    readers = read_by_rules(TOP / "rules", CATALOG)
    contradictions = {
        name: readers[name]
        for name, spec in {**CATALOG.metrics, **CATALOG.families}.items()
        if spec.informational and name in readers
    }
    assert contradictions == {}, f"declared informational, yet read by: {contradictions}"


def copy_of_catalog(tmp_path: Path, extra: str) -> Path:
    """The shipped rules and catalog under tmp_path, with `extra` lines added to the catalog's metrics."""
    rules = tmp_path / "rules"
    rules.mkdir()
    text = (TOP / "rules/metrics.yml").read_text()
    (rules / "metrics.yml").write_text(text.replace("\nmetrics:\n", f"\nmetrics:\n{extra}", 1))
    for source in (TOP / "rules").rglob("*"):
        target = rules / source.relative_to(TOP / "rules")
        if source.is_dir():
            target.mkdir(exist_ok=True)
        elif source.name != "metrics.yml":
            target.write_bytes(source.read_bytes())
    return rules


def test_a_metric_added_without_rule_or_reason_is_named(tmp_path):
    added = (
        "  gpu_fan_failed: {unit: bool, kind: gauge, better: lower, interval: 60, help: 'fan stopped'}\n"
        "  gpu_fan_speed_percent: {unit: percent, kind: gauge, better: none, interval: 60, help: 'fan',"
        " informational: 'the fan follows the temperature, which rules read'}\n"
    )
    rules = copy_of_catalog(tmp_path, added)
    catalog = Catalog.load(rules / "metrics.yml")
    before = set(unexplained(CATALOG, read_by_rules(TOP / "rules", CATALOG)))
    assert set(unexplained(catalog, read_by_rules(rules, catalog))) - before == {"gpu_fan_failed"}


@pytest.mark.parametrize("reason", ['""', "'  '", "true", "[throughput]"])
def test_informational_must_give_its_reason_as_text(tmp_path, reason):
    catalog = tmp_path / "metrics.yml"
    catalog.write_text(
        "metrics:\n"
        f"  gpu_fan_speed_percent: {{unit: percent, kind: gauge, better: none, interval: 60,"
        f" informational: {reason}}}\n"
    )
    with pytest.raises(CatalogError, match="gpu_fan_speed_percent: informational"):
        Catalog.load(catalog)


# The lab's own MTU case (tools/lab.py, node08): ib0 at 4096 on a node whose ConnectX-7 tree
# (the recorded gpud sysfs) has mlx5_1's port at an active MTU of 2048 (the switch's).
GPUD = FIXTURES / "public/sysfs/sys-class-infiniband-h100_gpud"
MTU_MISMATCH = Profile("h200", ib="gpud", faults=("mtu_mismatch",))
HEALTHY = Profile("h200", ib="gpud")


def ib_node(tmp_path: Path, profile: Profile, ib0_mtu: int, mode: str | None = None) -> Context:
    root = tmp_path / "root"
    shutil.copytree(GPUD, root / "sys/class/infiniband")
    for interface, mtu in (("eth0", 1500), ("ib0", ib0_mtu)):
        (root / "sys/class/net" / interface).mkdir(parents=True)
        (root / "sys/class/net" / interface / "mtu").write_text(f"{mtu}\n")
    if mode:
        (root / "sys/class/net/ib0/mode").write_text(f"{mode}\n")
    outputs = {("ibv_devinfo",): (0, ibv_devinfo(profile))}
    return Context(
        lambda argv, _timeout, _env=None: (*outputs.get(tuple(argv), (127, "")), ""),
        lambda name: f"/usr/bin/{name}" if name == "ibv_devinfo" else None,
        root=str(root),
        state_dir=str(tmp_path / "state"),
        clock=lambda: 1000.0,
    )


def mtu_excess(context: Context) -> dict[tuple[str, str], float]:
    return {
        (row["device"], row["labels"]["interface"]): row["value"]
        for row in collect_rdma.collect(context)["metrics"]
        if row["name"] == "ib_port_ipoib_mtu_excess_bytes"
    }


def test_ipoib_above_the_ports_active_mtu_is_a_metric_per_port(tmp_path):
    excess = mtu_excess(ib_node(tmp_path, MTU_MISMATCH, 4096))
    assert excess == {("mlx5_0/1", "ib0"): 4, ("mlx5_1/1", "ib0"): 4096 + 4 - 2048}


def test_ipoib_at_the_ports_mtu_less_its_header_is_not_above_it(tmp_path):
    assert set(mtu_excess(ib_node(tmp_path, HEALTHY, 4092)).values()) == {0}


def test_connected_mode_ipoib_is_not_compared_with_the_ports_mtu(tmp_path):
    assert mtu_excess(ib_node(tmp_path, MTU_MISMATCH, 65520, mode="connected")) == {}


def sweeps_of(store, node: str, rows: list[dict], at: int, count: int = 3) -> None:
    batch = MetricColumns()
    for sweep in range(count):
        for row in rows:
            stamp = at - sweep * 60_000
            batch.append(node, row["name"], row["device"], row["labels"], float(row["value"]), stamp)
    store.insert_metrics(batch)


def test_the_mtu_rule_fires_on_the_collectors_rows_of_the_labs_case(store, tmp_path):
    at = now_ms() - 30_000
    bad = collect_rdma.collect(ib_node(tmp_path / "bad", MTU_MISMATCH, 4096))["metrics"]
    good = collect_rdma.collect(ib_node(tmp_path / "good", HEALTHY, 4092))["metrics"]
    sweeps_of(store, "node08", bad, at)
    sweeps_of(store, "node01", good, at)
    findings = {(m.node_id, m.device): m for m in evaluate(store, rule("ipoib_mtu_above_port_mtu"), at)}
    assert sorted(findings) == [("node08", "mlx5_0/1"), ("node08", "mlx5_1/1")]
    assert findings[("node08", "mlx5_1/1")].value == 2052


def test_unreadable_sectors_fire_on_the_failing_drives_real_attributes_and_not_on_a_healthy_one(store):
    at = now_ms() - 30_000
    for node, capture in (
        ("node07", "public/smartctl/sata_hdd_wd3200bevt_when_failed_now_exit216.json"),  # 197 = 1, 187 = 84
        ("node02", "public/smartctl/sata_ssd_samsung_pm883_healthy.json"),
        ("node03", "public/smartctl/sata_hdd_seagate_realloc304.json"),  # reallocated, nothing unreadable
    ):
        sweeps_of(store, node, smart_metrics(parse_smartctl_json(fixture_text(capture))), at)
    (finding,) = evaluate(store, rule("ata_uncorrectable_sectors"), at)
    assert (finding.node_id, finding.device) == ("node07", "sdb")
    assert finding.values == {"smart_current_pending_sector": 1, "smart_reported_uncorrect": 84}
