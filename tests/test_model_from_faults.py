"""`stethoscope model finetune --from-faults` (issue 21, real data in): a GPU class the model was not
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


@pytest.mark.slow
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
