"""`stethoscope model finetune --from-faults` (real data in): a GPU class the model was not
trained for is calibrated on its own healthy windows in the store and then classified, its findings
marked self-calibrated; the heads are tuned on the windows of the faults recorded in the store
(`fault confirm` records them with `store.faults.record`, as here), read back from fault_windows.
A real embedded store, the shipped model copied out, torch for the heads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from stethoscope.cli.main import main
from stethoscope.model.findings import run_model
from stethoscope.model.metadata import load, metadata_path
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.faults import Fault, record
from stethoscope_training import episodes

A100 = "NVIDIA A100-SXM4-80GB"
END_MS = (1_798_761_600_000 // 60_000) * 60_000
WINDOW_MS = 600_000
HEALTHY_NODES = [f"a100-{i:02d}" for i in range(6)]
FAULTS = [
    ("communication.rdma_drop_storm", "communication"),
    ("storage.nvme_overheat", "storage"),
    ("compute.power_brake", "compute"),
]


def test_an_untrained_class_is_self_calibrated_and_the_heads_learn_the_store_s_faults(tmp_path) -> None:
    pytest.importorskip("torch")
    data = episodes.generate(seed=5, per_family=6, hw_class="shifted")  # a class unlike the H200
    healthy = iter(np.flatnonzero(data.family == "healthy.training"))
    dsn, database = f"chdb://{tmp_path / 'db'}", "t_from_faults"
    with Store(dsn, database) as store:
        store.init_schema()
        rows = []
        for node in HEALTHY_NODES:  # 4 windows of 10 minutes each, the newest ending at END_MS
            index = int(next(healthy))
            for back in range(4):
                rows += data.to_rows(index, node, END_MS - back * WINDOW_MS)
        faults = []
        for n in range(10):
            family, layer = FAULTS[n % len(FAULTS)]
            index = int(np.flatnonzero(data.family == family)[n // len(FAULTS)])
            node, impact = f"a100-f{n:02d}", END_MS - 3 * 3600_000 - n * WINDOW_MS
            rows += data.to_rows(index, node, impact)
            faults.append(Fault(node, family, layer, impact, source="confirmed"))
        store.insert_metrics(MetricColumns.from_rows(rows))
        nodes = HEALTHY_NODES + [f.node_id for f in faults]
        detail = json.dumps({"gpu": {"models": [A100], "count": 8}})
        store.insert_rows(
            "fingerprints",
            [
                {"fingerprint": "a100x8", "kind": "class", "node_id": n, "detail": detail, "first_seen": 0}
                for n in nodes
            ],
        )
        before = run_model(store, END_MS, meta=load(metadata_path()))
        for fault in faults:
            record(store, fault)  # what `stethoscope fault confirm` does with a stored finding
    assert set(before.unjudged[A100]) == set(HEALTHY_NODES)  # not trained for it: not classified

    out = tmp_path / "model"
    argv = ["--dsn", dsn, "--database", database, "model", "finetune", "--from-faults", "--days", "0.03"]
    assert main([*argv, "--out", str(out)]) == 0

    tuned = load(out / "core12.json")
    assert tuned.calibration[A100]["source"] == "self-calibrated"
    assert tuned.calibration[A100]["nodes"] == len(HEALTHY_NODES)
    assert tuned.calibration[A100]["windows"] == 4 * len(HEALTHY_NODES)
    last = tuned.history[-1]
    # each fault's node streamed the 10 minutes before its impact: the windows at impact and 5 minutes
    # before read it, the one 10 minutes before reads nothing
    assert (last["action"], last["faults"], last["fault_windows"], last["tuned"]) == (
        "finetune-from-faults",
        10,
        20,
        True,
    )
    assert last["after"]["accuracy"] >= last["before"]["accuracy"]
    with Store(dsn, database) as store:
        after = run_model(store, END_MS, meta=tuned)
    assert A100 not in after.unjudged
    assert set(HEALTHY_NODES) <= set(after.evaluated)
    assert all(f.calibration == "self-calibrated" for f in after.findings if f.node_id in HEALTHY_NODES)


def _finding(rule_id: str, node: str, severity: str, first: int, last: int, status: str, nodes=()) -> dict:
    return {
        "finding_id": f"{rule_id}-{node}",
        "txn_id": f"txn-{node}",
        "rule_id": rule_id,
        "node_id": node,
        "device": "",
        "severity": severity,
        "confidence": 1.0,
        "level": "L2",
        "message": "",
        "evidence": json.dumps({"nodes": list(nodes)} if nodes else {}),
        "first_seen": first,
        "last_seen": last,
        "status": status,
        "version": 1,
    }


def test_nodes_with_open_findings_give_no_healthy_windows(store) -> None:
    """Regression: self-calibration took every node without a recorded fault for healthy, so a node
    with an open finding (a rule's, UNKNOWN's, the model's) lent its faulty windows to its class's
    normalisation. A finding's span is first_seen..last_seen, open-ended while it is not resolved;
    an info finding says nothing is wrong."""
    from stethoscope_training.from_store import STRIDE_MS, healthy_windows

    data = episodes.generate(seed=5, per_family=1, hw_class="shifted")
    index = int(np.flatnonzero(data.family == "healthy.training")[0])
    names = ["a100-00", "a100-01", "open", "fleet-silent", "resolved-before", "info", "newest-only"]
    rows = []
    for node in names:
        for back in range(4):
            rows += data.to_rows(index, node, END_MS - back * WINDOW_MS)
    store.insert_metrics(MetricColumns.from_rows(rows))
    detail = json.dumps({"gpu": {"models": [A100], "count": 8}})
    store.insert_rows(
        "fingerprints",
        [
            {"fingerprint": "a100x8", "kind": "class", "node_id": n, "detail": detail, "first_seen": 0}
            for n in names
        ],
    )
    t, hour, stride = END_MS, 3600_000, STRIDE_MS
    store.insert_rows(
        "findings",
        [
            _finding("nvme_temperature_high", "open", "warning", t - 2 * hour, t - 2 * hour, "open"),
            _finding("unknown.fleet", "fleet", "critical", t - hour, t - hour, "stale", ["fleet-silent"]),
            _finding("gpu_xid", "resolved-before", "critical", t - 3 * hour, t - 2 * hour, "resolved"),
            _finding("ib_counter_saturated", "info", "info", t - 2 * hour, t, "open"),
            _finding("gpu_xid", "newest-only", "warning", t - stride // 2, t - stride // 3, "resolved"),
        ],
    )
    (x, _mask, nodes), *others = healthy_windows(store, 0.03, [], load(metadata_path())).values()
    assert not others
    assert nodes == {"a100-00", "a100-01", "resolved-before", "info", "newest-only"}
    assert len(x) == 4 * 4 + 3  # newest-only: its three older windows
