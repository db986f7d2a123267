"""The lab's real sweeps, laid out again at any cadence: three runs of collect.yml on the lab (the
modules, the callback, embedded ClickHouse) recorded as the rows the collector stored each time, and
those rows written again at the sweep times a test or benchmark needs (every 300 s ± 60 s, one lost):
the shape of a real cluster's sweeps, from the real collector."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
Sweep = list[tuple]  # (node_id, metric_name, device, labels, value)
# what the lab injects as a state (present in every sweep), and the rules that find it
STATE_FAULTS = (
    ("node03", "gpu_thermal_throttling"),
    ("node04", "gpu_row_remap_pending"),
    ("node06", "nvlink_physical_error"),
    ("node07", "ssd_reallocated_sectors"),
    ("node08", "ib_port_not_active"),
    ("node08", "net_mtu_mismatch"),
    ("node08", "rdma_qp_in_error"),
)
HEALTHY = ("node01", "node05")  # lab nodes with no fault at all
Recorded = tuple[list[Sweep], list[tuple]]  # the sweeps and the `nodes` rows


def record(folder: Path, sweeps: int = 3) -> Recorded:
    """Build the lab under `folder`, sweep it `sweeps` times, and return each sweep's rows."""
    from stethoscope.store.client import Store

    dsn = f"chdb://{folder / 'db'}"
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(TOP / "ansible.cfg"),
        "ANSIBLE_INVENTORY": str(TOP / "inventories/lab/hosts.yml"),
        "ANSIBLE_LOCAL_TEMP": str(folder / "ansible-tmp"),
        "ANSIBLE_HOME": str(folder / "ansible-home"),
        "STETHOSCOPE_LAB_DIR": str(folder / "lab"),
        "STETHOSCOPE_DSN": dsn,
        "STETHOSCOPE_SPOOL_DIR": str(folder / "spool"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    for command in ([str(TOP / "tools/lab.py"), "build"], ["-m", "stethoscope.cli", "db", "init"]):
        subprocess.run([sys.executable, *command], env=env, cwd=TOP, check=True, capture_output=True)
    recorded: list[Sweep] = []
    nodes: list[tuple] = []
    last = 0
    for _ in range(sweeps):
        play = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), str(TOP / "playbooks/collect.yml")],
            env=env,
            cwd=TOP,
            capture_output=True,
            text=True,
        )
        if play.returncode != 0:
            raise RuntimeError(f"collect.yml failed on the lab:\n{play.stdout[-3000:]}")
        with Store(dsn) as store:
            rows = store.query(
                "SELECT node_id, metric_name, device, labels, value, toUnixTimestamp64Milli(timestamp) "
                f"FROM {store.database}.metrics WHERE toUnixTimestamp64Milli(timestamp) > {{last:Int64}}",
                {"last": last},
            )
            nodes = store.query(
                f"SELECT node_id, slurm_name, rack, switch, groups FROM {store.database}.nodes FINAL"
            )
        last = max(row[5] for row in rows)
        recorded.append([row[:5] for row in rows])
    return recorded, nodes


def lay_out(store, recorded: Recorded, times_ms: list[int], skip_nodes=()) -> None:
    """Write the recorded sweeps at `times_ms` (one sweep each, the last recorded one repeated past
    the last): every row as the collector stored it, at that sweep's time."""
    from stethoscope.store.batch import MetricColumns

    sweeps, nodes = recorded
    store.insert_rows(
        "nodes",
        [
            {"node_id": n, "slurm_name": s, "rack": r, "switch": w, "groups": g, "updated_at": times_ms[0]}
            for n, s, r, w, g in nodes
        ],
    )
    for index, at in enumerate(times_ms):
        batch = MetricColumns()
        for node, metric, device, labels, value in sweeps[min(index, len(sweeps) - 1)]:
            if node not in skip_nodes:
                batch.append(node, metric, device, dict(labels), float(value), at)
        store.insert_metrics(batch)


def jittered(
    at: int, interval: int, count: int, seed: int, lost: tuple[int, ...] = (), jitter: float = 0.2
) -> list[int]:
    """`count` sweep times `interval` s apart up to `at`, each up to `jitter` of an interval off its
    slot; the sweeps numbered in `lost` never came."""
    rnd = random.Random(seed)
    slots = [at - k * interval * 1000 for k in range(count)]
    times = sorted(t + int(rnd.uniform(-jitter, jitter) * interval * 1000) for t in slots)
    return [t for k, t in enumerate(times) if k not in lost]
