"""The metric catalog: well formed, and every name a module emits is in it."""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import (
    dmon_metrics,
    gpu_metrics,
    parse_dmon,
    parse_query_xml,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.smartctl import (
    parse_smartctl_json,
    smart_metrics,
)
from stethoscope.catalog import Catalog, CatalogError, default_path

from conftest import FIXTURES, TOP, fixture_text

CATALOG = Catalog.load()
UNIT_SUFFIXES = (
    "_bytes",
    "_celsius",
    "_watts",
    "_mhz",
    "_mib",
    "_percent",
    "_us",
    "_ms",
    "_gbit_per_s",
    "_gb_per_s",
    "_mb_per_s",
    "_total",
    "_per_second",
    "_seconds",
)


def emitted_names_in_source() -> set[str]:
    """Every metric name literal the node-side code passes to metric()/add() or keeps in a name map."""
    names = set()
    for path in (TOP / "plugins/module_utils").glob("*.py"):
        text = path.read_text()
        names.update(re.findall(r'(?:metric|add)\((?:rows, )?"([a-z0-9_]+)"', text))
        names.update(re.findall(r'"((?:ib|rdma|nvlink|pcie)_[a-z0-9_]+(?:_total|_count|_percent))"', text))
    return names


def test_every_literal_name_is_catalogued():
    names = emitted_names_in_source()
    assert len(names) > 40
    assert sorted(n for n in names if n not in CATALOG) == []


@pytest.mark.parametrize("fixture", sorted(p.name for p in (FIXTURES / "public/smartctl").glob("*.json")))
def test_smart_attributes_of_every_real_sample_are_catalogued(fixture):
    disk = parse_smartctl_json(fixture_text(f"public/smartctl/{fixture}"))
    rows = smart_metrics(disk)
    assert rows
    assert [r["name"] for r in rows if r["name"] not in CATALOG.metrics] == []


def test_gpu_metric_rows_from_real_captures_are_catalogued():
    gpus = parse_query_xml(fixture_text("real/h200-vm/commands/nvidia-smi_-q_-x.xml"))["gpus"]
    rows = gpu_metrics(gpus) + dmon_metrics(
        parse_dmon(fixture_text("real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt"))
    )
    assert {r["name"] for r in rows} <= set(CATALOG.metrics)


def test_names_carry_their_unit_or_are_known_exceptions():
    exceptions = {
        "gpu_pcie_link_gen",
        "bench_gemm_mismatch",  # flags and a checksum: no unit
        "bench_gemm_quorum_suspect",
        "bench_gemm_checksum",
        "bench_fio_latency_jumped",  # a flag: whether the sustained write's latency jumped
        "bench_rdma_rc_local_ack_timeouts",  # a counter's increase during one pair's run: a count
        "bench_rdma_rc_rnr_nak_retries",
        "bench_rdma_rc_packet_seq_errors",
        "bench_rdma_rc_out_of_sequence",
        "gpu_pcie_link_width",
        "gpu_remapped_rows_correctable",
        "gpu_remapped_rows_uncorrectable",
        "gpu_remapped_rows_pending",
        "gpu_remapping_failure",
        "gpu_throttle_reasons_active",
        "gpu_thermal_violation",
        "nvlink_link_up",
        "pcie_link_degraded",
        "ib_port_state",
        "ib_port_phys_state",
        "ib_port_active_mtu",
        "rdma_qp_error_count",
        "smart_health_passed",
        "smart_exit_status",
        "nvme_percentage_used",
        "nvme_critical_warning",
        "cpu_governor_performance",
        "cpu_max_cstate",
        "numa_balancing_enabled",
        "net_mtu",
        "nvme_volatile_write_cache_enabled",
        "train_loss_variance",
        "cuda_memory_fragmentation_ratio",
        "bench_gemm_tflops",
        "bench_fio_randread_iops",
        "gpu_retired_pages_pending",
        "pcie_aer_status_flags",
        "ansible_host_unreachable",  # 0/1, like nvlink_link_up
        # a broken instrument (collector_failure): 0/1 gauges, and the tool's exit code
        "collector_failed",
        "collector_gpu_lost",
        "collector_hca_missing",
        "collector_disk_unreadable",
        "collector_exit_code",
    }
    for name, spec in CATALOG.metrics.items():
        if name.startswith("smart_") and name not in exceptions:
            continue  # SMART attributes keep their vendor names
        assert name.endswith(UNIT_SUFFIXES) or name in exceptions, name
        if spec.kind == "counter":
            assert name.endswith("_total"), name


def test_family_prefix_accepts_vendor_attributes_but_not_strangers():
    assert "smart_some_vendor_attribute" in CATALOG
    assert "gpu_made_up_metric" not in CATALOG


def test_broken_catalog_is_reported_with_the_file(tmp_path):
    bad = tmp_path / "metrics.yml"
    bad.write_text("metrics:\n  x_total: {unit: count, kind: weird, better: lower, interval: 60}\n")
    with pytest.raises(CatalogError, match=r"metrics.yml: x_total: kind"):
        Catalog.load(bad)


def test_catalog_file_is_the_default():
    assert default_path() == TOP / "rules" / "metrics.yml"
    assert json.dumps(sorted(CATALOG.metrics)).count("smart_") >= 100


def test_an_inventory_sets_the_sweep_interval_and_single_metrics():
    from stethoscope.catalog import CatalogError

    base = Catalog.load()
    slower = base.with_intervals(300, {"gpu_temperature_celsius": 30, "smart_reallocated_sector_ct": 600})
    assert slower.get("ib_port_state").interval == 300  # swept by Ansible: the inventory's sweep
    assert slower.get("smart_media_wearout_indicator_normalized").interval == 300  # a family member
    assert slower.get("gpu_temperature_celsius").interval == 30
    assert slower.get("smart_reallocated_sector_ct").interval == 600
    assert slower.get("bench_gemm_tflops").interval == base.get("bench_gemm_tflops").interval  # not swept
    assert slower.get("train_step_time_ms").interval == base.get("train_step_time_ms").interval
    assert base.with_intervals("5m").get("ib_port_state").interval == 300  # the one duration syntax
    for sweep, per_metric, message in [
        (0, None, "stethoscope_sweep_interval: 0 is not a duration above 0"),
        ("5 min", None, "stethoscope_sweep_interval: '5 min' is not a duration above 0"),
        (None, ["x"], "must be a mapping"),
        (None, {"gpu_made_up": 5}, "names metrics not in the catalog: gpu_made_up"),
    ]:
        with pytest.raises(CatalogError, match=message):
            base.with_intervals(sweep, per_metric)


def test_device_kinds_are_catalog_data_with_their_enclosing_kind():
    assert CATALOG.enclosing("nvlink_crc_errors_total").name == "gpu"  # gpu2/link3 belongs to gpu2
    assert CATALOG.device_kind("ib_symbol_errors_total").parent == "hca"
    assert CATALOG.enclosing("rdma_qps_dropped_per_second").name == "hca"
    assert CATALOG.enclosing("smart_some_vendor_attribute").name == "disk"
    assert CATALOG.enclosing("net_mtu") is None  # node level
    assert re.fullmatch(CATALOG.device_kinds["pci"].pattern, "0000:17:00.0")


def test_events_are_a_kind_with_the_counter_aggregates():
    from stethoscope.catalog import AGGREGATES

    assert CATALOG.kind("gpu_xid_errors_total") == CATALOG.kind("node_fingerprint_changes_total") == "events"
    cumulative = ("delta", "last", "rate", "slope", "growth_percent")  # the default first
    assert AGGREGATES["events"] == AGGREGATES["counter"] == cumulative
    assert CATALOG.get("gpu_xid_preexisting_total").layer == "compute"


def test_a_device_kind_under_an_unknown_parent_is_reported(tmp_path):
    bad = tmp_path / "metrics.yml"
    bad.write_text("device_kinds:\n  port: {pattern: 'x/[0-9]+', parent: card, metrics: [port_]}\n")
    with pytest.raises(CatalogError, match=r"metrics.yml: device_kinds: port: parent 'card'"):
        Catalog.load(bad)
