"""`stethoscope audit` (docs/design.md "Reports and audit") on a 6-hour fault history of the lab's
fault kinds: sweep rows, one a minute, in the shape the collectors return them (the callback's own
conversion stores them), healthy until each fault's onset and then as the lab's faulted nodes report
(the values of a real lab sweep). The audit must warn no earlier than the onset and soon after it."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from stethoscope.cli.main import main
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.result_rows import rows_from_result
from stethoscope.timeutil import iso, now_ms

MINUTE = 60_000
IMPACT = now_ms() // MINUTE * MINUTE - 10 * MINUTE
MOMENT = dt.datetime.fromtimestamp(IMPACT / 1000, tz=dt.UTC)


def _healthy(metric: str) -> float:
    return {"gpu_temperature_celsius": 45.0, "smart_reallocated_sector_ct": 4.0}.get(metric, 0.0)


# kind -> (node, device, layer, minutes from onset to impact, series: (metric, device, faulted value at
# minute m after the onset)); values as the lab's faulted nodes report them (tools/lab.py, per sweep)
FAULTS = {
    "ssd_wear": ("node07", "sda", "storage", 300, [
        ("smart_reallocated_sector_ct", "sda", lambda m: 4 + 2 * m),
        ("smart_media_wearout_indicator_normalized", "sda", lambda m: max(8, 55 - m)),
    ]),
    "aer_storm": ("node06", "0000:00:06.0", "compute", 240, [
        ("pcie_aer_correctable_errors_total", "0000:00:06.0", lambda m: 250 * (m + 1)),
    ]),
    "nvlink_crc": ("node06", "gpu0/link3", "communication", 300, [
        ("nvlink_crc_errors_total", "gpu0/link3", lambda m: 40 * (m + 1)),
        ("nvlink_error_rate_percent", "gpu0/link3", lambda m: 0.002),
    ]),
    "qp_error": ("node08", "mlx5_1/1", "network", 180, [
        ("rdma_qp_error_count", "mlx5_1/1", lambda m: 1 + min(m, 2)),
    ]),
    "throttling": ("node03", "gpu0", "compute", 10, [
        ("gpu_throttle_reasons_active", "gpu0", lambda m: 96),
        ("gpu_temperature_celsius", "gpu0", lambda m: 89 + min(m, 6)),
    ]),
}  # fmt: skip
# series every node reports whether faulted or not, so that a healthy stretch is data, not silence
COMMON = [("gpu_temperature_celsius", "gpu0"), ("gpu_throttle_reasons_active", "gpu0")]


def _history(store: Store) -> None:
    """Six hours and a bit of one-minute sweeps up to the impact, for every faulted node."""
    start = IMPACT - 7 * 60 * MINUTE
    by_node: dict[str, list] = {}
    rows = MetricColumns()
    for node, _device, _layer, lead, series in FAULTS.values():
        by_node.setdefault(node, []).extend((metric, device, lead, f) for metric, device, f in series)
    for node, series in by_node.items():
        faulted = {(metric, device) for metric, device, _lead, _f in series}
        series += [(m, d, None, None) for m, d in COMMON if (m, d) not in faulted]
        for at in range(start, IMPACT + 1, MINUTE):
            metrics = []
            for metric, device, lead, value_at in series:
                onset = IMPACT - lead * MINUTE if lead is not None else None
                faulty = onset is not None and at >= onset
                value = value_at((at - onset) // MINUTE) if faulty else _healthy(metric)
                metrics.append({"name": metric, "device": device, "value": float(value), "labels": {}})
            rows.extend(rows_from_result(node, {"stethoscope_metrics": metrics}, "sweep", at).metrics)
    store.insert_metrics(rows)
    place = {"rack": "rack2", "switch": "leaf2", "groups": [], "updated_at": MOMENT}
    nodes = [
        {"node_id": n, "slurm_name": n, **place}
        for n in [*by_node, "node09"]  # node09: in the inventory, no row left
    ]
    store.insert_rows("nodes", nodes)


def _faults_file(path: Path, kinds: list[str], extra: list[dict] | None = None) -> Path:
    import yaml

    entries = [
        {"node": node, "device": device, "kind": k, "layer": layer, "impact": iso(IMPACT)}
        for k in kinds
        for node, device, layer, _lead, _series in [FAULTS[k]]
    ]
    path.write_text(yaml.safe_dump({"faults": entries + (extra or [])}, sort_keys=False))
    return path


@pytest.fixture
def history(store):
    _history(store)
    store.close()  # the CLI opens the embedded path itself
    return store


def _audit(capsys, store: Store, *args: str) -> tuple[int, dict]:
    code = main(["audit", "--dsn", store.dsn, "--json", *args])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip().startswith("{") else {}


NO_DATA = {"node": "node09", "kind": "ssd_wear", "layer": "storage", "impact": iso(IMPACT), "device": "nvme0"}


def test_audit_leads_per_kind_and_exit_1_when_a_kind_is_under_target(history, tmp_path, capsys):
    faults = _faults_file(tmp_path / "faults.yml", list(FAULTS), [NO_DATA])
    code, audit = _audit(capsys, history, "--faults", str(faults), "--lead-target", "30m")
    by_kind = {k["kind"]: k for k in audit["kinds"]}
    for kind, (_node, _device, _layer, lead, _series) in FAULTS.items():
        warned = by_kind[kind]["median_lead_minutes"]
        # never before the onset (the healthy stretch is quiet), and within 15 min of it
        assert lead - 15 <= warned <= lead, (kind, warned, audit)
    assert by_kind["throttling"]["under_target"] and not by_kind["ssd_wear"]["under_target"]
    assert code == 1
    (lost,) = [f for f in audit["faults"] if f["node_id"] == "node09"]
    assert lost["outcome"] == "not replayable" and lost["lead_minutes"] is None
    assert by_kind["ssd_wear"]["faults"] == 2 and by_kind["ssd_wear"]["replayed"] == 1


def test_audit_exit_0_when_every_kind_meets_the_target(history, tmp_path, capsys):
    faults = _faults_file(tmp_path / "faults.yml", ["ssd_wear", "aer_storm", "qp_error"])
    code, audit = _audit(capsys, history, "--faults", str(faults), "--lead-target", "45m")
    assert code == 0, audit
    assert {k["kind"] for k in audit["kinds"]} == {"ssd_wear", "aer_storm", "qp_error"}


def test_a_kind_with_no_fault_left_to_replay_is_not_judged_as_meeting_its_target(history, tmp_path, capsys):
    # it exited 0: an audit whose faults all expired "passed"
    faults = _faults_file(tmp_path / "faults.yml", [], [NO_DATA])
    code, audit = _audit(capsys, history, "--faults", str(faults), "--lead-target", "30m")
    (kind,) = audit["kinds"]
    assert kind["median_lead_minutes"] is None and kind["under_target"]
    assert code == 1


def test_a_finding_of_another_layer_on_the_node_is_no_warning(history, tmp_path, capsys):
    # node06's NVLink CRC errors (communication) run for 4 h: a storage fault there is still missed
    faults = _faults_file(
        tmp_path / "f.yml", [], [{"node": "node06", "kind": "x", "layer": "storage", "impact": iso(IMPACT)}]
    )
    code, audit = _audit(capsys, history, "--faults", str(faults))
    (fault,) = audit["faults"]
    assert fault["outcome"] == "missed" and audit["kinds"][0]["median_lead_minutes"] == 0
    assert code == 1


def _raw_rows(store: Store, node: str) -> int:
    sql = f"SELECT count() FROM {store.database}.metrics WHERE node_id = {{n:String}}"
    return store.query(sql, {"n": node})[0][0]


def test_audit_replays_fault_windows_after_the_raw_rows_are_deleted(history, tmp_path, capsys):
    kind = "qp_error"
    node, device, layer, _lead, _series = FAULTS[kind]
    add = ["fault", "add", "--dsn", history.dsn, "--node", node, "--kind", kind, "--layer", layer]
    assert main([*add, "--device", device, "--impact", iso(IMPACT)]) == 0
    assert "raw rows kept in fault_windows" in capsys.readouterr().out
    code, before = _audit(capsys, history)
    with Store(history.dsn) as store:
        store.command(
            f"ALTER TABLE {store.database}.metrics DELETE WHERE node_id = {{n:String}} "
            "SETTINGS mutations_sync = 1",
            {"n": node},
        )
        assert _raw_rows(store, node) == 0
    code_after, after = _audit(capsys, history)
    assert before["faults"][0]["source"] == "metrics"
    assert after["faults"][0]["source"] == "fault_windows"
    assert after["faults"][0]["lead_minutes"] == before["faults"][0]["lead_minutes"] > 0
    assert code_after == code
    with Store(history.dsn) as store:  # the replay went to a scratch database, never the live metrics
        assert _raw_rows(store, node) == 0
        assert not store.query(f"SHOW DATABASES LIKE '{store.database}_audit_scratch'")


def test_reimporting_a_faults_file_is_idempotent(history, tmp_path, capsys):
    faults = _faults_file(tmp_path / "faults.yml", ["qp_error", "ssd_wear"])
    _audit(capsys, history, "--faults", str(faults), "--lead-target", "1m")
    with Store(history.dsn) as store:
        db = store.database
        first = store.query(f"SELECT count() FROM {db}.faults FINAL")[0][0]
        kept = store.query(f"SELECT count() FROM {db}.fault_windows FINAL")[0][0]
    _audit(capsys, history, "--faults", str(faults), "--lead-target", "1m")
    assert main(["fault", "list", "--json", "--dsn", history.dsn]) == 0
    listed = json.loads(capsys.readouterr().out)
    with Store(history.dsn) as store:
        assert store.query(f"SELECT count() FROM {db}.faults FINAL")[0][0] == first == len(listed) == 2
        assert store.query(f"SELECT count() FROM {db}.fault_windows FINAL")[0][0] == kept > 0


@pytest.mark.parametrize(
    "entry, problem",
    [
        ({"node": "node07", "kind": "k", "layer": "disk", "impact": "latest"}, "unknown layer 'disk'"),
        ({"node": "node07", "kind": "k", "layer": "storage", "impact": "yesterday"}, "impact 'yesterday'"),
        ({"node": "node42", "kind": "k", "layer": "storage", "impact": "latest"}, "unknown node 'node42'"),
    ],
)
def test_a_bad_faults_file_is_exit_2_naming_file_and_line_and_imports_nothing(
    history, tmp_path, capsys, entry, problem
):
    faults = _faults_file(tmp_path / "faults.yml", ["qp_error"], [entry])
    code = main(["audit", "--dsn", history.dsn, "--faults", str(faults)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"{faults}:" in err and problem in err and "nothing imported" in err
    assert "Traceback" not in err
    with Store(history.dsn) as store:
        assert store.query(f"SELECT count() FROM {store.database}.faults")[0][0] == 0


def test_a_csv_faults_file_with_a_relative_impact_names_its_line(history, tmp_path, capsys):
    faults = tmp_path / "faults.csv"
    faults.write_text("node,kind,layer,impact\nnode08,qp_error,network,latest\nnode08,x,network,latest-1q\n")
    assert main(["audit", "--dsn", history.dsn, "--faults", str(faults)]) == 2
    assert f"{faults}:3: impact 'latest-1q'" in capsys.readouterr().err
    faults.write_text("node,kind,layer,impact,device\nnode08,qp_error,network,latest,mlx5_1/1\n")
    code, audit = _audit(capsys, history, "--faults", str(faults), "--lead-target", "10m")
    assert code == 0 and audit["faults"][0]["impact_at"] == iso(IMPACT)


@pytest.mark.parametrize("target", ["30 min", "half an hour", "-5m", "1x"])
def test_a_bad_lead_target_is_exit_2(history, capsys, target):
    assert main(["audit", "--dsn", history.dsn, f"--lead-target={target}"]) == 2
    assert "--lead-target" in capsys.readouterr().err


def test_fault_confirm_takes_node_device_and_layer_from_the_stored_finding(history, capsys):
    from stethoscope.diagnosis.findings import finding_id

    node, device = "node08", "mlx5_1/1"
    fid = finding_id("rdma_qp_in_error", node, device)
    with Store(history.dsn) as store:
        row = {
            "finding_id": fid, "txn_id": "t", "rule_id": "rdma_qp_in_error", "node_id": node,
            "device": device,
            "severity": "warning", "confidence": 1.0, "level": "L2", "message": "m", "evidence": "{}",
            "first_seen": MOMENT, "last_seen": MOMENT, "status": "open", "version": 1,
        }  # fmt: skip
        store.insert_rows("findings", [row])
    assert main(["fault", "confirm", fid, "--impact", iso(IMPACT), "--dsn", history.dsn]) == 0
    capsys.readouterr()
    assert main(["fault", "list", "--json", "--dsn", history.dsn]) == 0
    (fault,) = json.loads(capsys.readouterr().out)
    assert (fault["node_id"], fault["device"], fault["layer"], fault["source"]) == (
        node, device, "network", "confirmed",
    )  # fmt: skip
    assert fault["kind"] == "rdma_qp_in_error"
    assert main(["fault", "confirm", "nope", "--impact", "latest", "--dsn", history.dsn]) == 2


def test_audit_page_beside_the_board_escapes_what_is_data(history, tmp_path, capsys):
    faults = _faults_file(tmp_path / "f.yml", ["qp_error"])
    faults.write_text(faults.read_text().replace("impact:", "note: <script>alert(1)</script>\n  impact:"))
    out = tmp_path / "board"
    code = main(["audit", "--dsn", history.dsn, "--faults", str(faults), "--out", str(out)])
    page = (out / "audit.html").read_text()
    assert code == 0 and f"wrote {out / 'audit.html'}" in capsys.readouterr().out
    assert 'data-kind="qp_error"' in page and 'data-outcome="warned"' in page
    assert "<script" not in page and "http://" not in page and "https://" not in page


def test_db_init_adds_the_fault_tables_to_a_database_from_before_them(store, capsys):
    db = store.database
    store.command(f"DROP TABLE {db}.faults")
    store.command(f"DROP TABLE {db}.fault_windows")
    store.close()
    assert main(["db", "init", "--dsn", store.dsn, "--database", db]) == 0
    capsys.readouterr()
    with Store(store.dsn, db) as again:
        sql = "SELECT name, create_table_query FROM system.tables WHERE database = {db:String}"
        created = dict(again.query(sql, {"db": db}))
        assert {"faults", "fault_windows"} <= set(created)
        assert "ReplacingMergeTree" in created["faults"]
        assert "toIntervalDay(730)" in created["fault_windows"] or "730 DAY" in created["fault_windows"]
        statements = again.check_cluster_ddl("gpu_cluster")  # ClickHouse's own parser reads them
        assert any("fault_windows_local" in s for s in statements)


def test_a_fault_older_than_the_raw_ttl_replays_from_its_kept_window(store, capsys):
    # a quarter ago: the raw rows are long gone; fault_windows kept them (as `fault add` copied then)
    from stethoscope.store.faults import Fault

    shift = 90 * 86_400_000
    _history(store)
    db = store.database
    old = store.query(
        f"SELECT node_id, metric_name, device, labels, value, toUnixTimestamp64Milli(timestamp) "
        f"FROM {db}.metrics WHERE node_id = 'node08'"
    )
    kept = MetricColumns()
    for node, metric, device, labels, value, at in old:
        kept.append(node, metric, device, dict(labels), value, at - shift)
    store.insert_metrics(kept, table="fault_windows")
    store.command(f"ALTER TABLE {db}.metrics DELETE WHERE node_id = 'node08' SETTINGS mutations_sync = 1")
    node, device, layer, lead, _series = FAULTS["qp_error"]
    fault = Fault(node, "qp_error", layer, IMPACT - shift, device)
    store.insert_rows("faults", [{**_fault_row(fault)}])
    store.close()
    code, audit = _audit(capsys, store, "--lead-target", "30m")
    (result,) = audit["faults"]
    assert result["source"] == "fault_windows" and lead - 15 <= result["lead_minutes"] <= lead
    assert code == 0


def _fault_row(fault) -> dict:
    moment = dt.datetime.fromtimestamp(fault.impact_ms / 1000, tz=dt.UTC)
    row = {k: v for k, v in fault.as_dict().items() if k not in ("impact_ms", "impact_at")}
    return {**row, "impact_at": moment, "recorded_at": moment}


@pytest.mark.parametrize(
    "finding, layer, device, warned",
    [
        # the model's communication class covers the catalog layers communication and network
        ({"rule_id": "model.communication"}, "network", "mlx5_1/1", True),
        ({"rule_id": "model.communication"}, "communication", "gpu0/link3", True),
        ({"rule_id": "model.storage"}, "network", "", False),
        ({"rule_id": "model.compute"}, "compute", "gpu0", True),
        # the outlier detector: the class its largest deviation's feature speaks for (model_layer, as
        # diagnosis.model_findings writes it), not that metric's catalog band: AER is the compute band's
        ({"rule_id": "model.outlier", "model_layer": "communication",
          "explanation": {"rdma_qps_dropped_per_second": 70, "ib_port_xmit_wait_per_second": 3}},
         "network", "", True),
        ({"rule_id": "model.outlier", "model_layer": "communication",
          "explanation": {"pcie_aer_correctable_errors_per_second": 90}}, "communication", "", True),
        ({"rule_id": "model.outlier", "model_layer": "communication",
          "explanation": {"pcie_aer_correctable_errors_per_second": 90}}, "compute", "", False),
        ({"rule_id": "model.outlier", "model_layer": "storage",
          "explanation": {"disk_temperature_celsius": 60, "gpu_power_watts": 40}}, "compute", "", False),
        ({"rule_id": "model.storage", "node_id": "node07"}, "storage", "sda", False),  # another node
    ],
)  # fmt: skip
def test_model_findings_count_for_the_layer_the_docs_give_them(finding, layer, device, warned):
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.audit import warns
    from stethoscope.store.faults import Fault

    finding = {"node_id": "node08", "device": "", **finding}
    assert warns(Fault("node08", "k", layer, IMPACT, device), finding, Catalog.load()) is warned


def test_a_rule_finding_counts_on_the_enclosing_device_and_only_for_its_layers():
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.audit import warns
    from stethoscope.store.faults import Fault

    catalog = Catalog.load()
    link = {"node_id": "node06", "device": "gpu0/link3", "rule_id": "r", "_layers": {"communication"}}
    assert warns(Fault("node06", "k", "communication", IMPACT, "gpu0"), link, catalog)
    assert not warns(Fault("node06", "k", "communication", IMPACT, "gpu1"), link, catalog)
    assert not warns(Fault("node06", "k", "compute", IMPACT, "gpu0"), link, catalog)
