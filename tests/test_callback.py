"""The ClickHouse callback in real ansible-playbook runs of collect.yml on the lab: a sink that is up,
refusing, and hung. The play never fails or stalls because of the sink, and nothing is lost."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stethoscope.store.client import Store
from stethoscope.store.spool import Spool

from conftest import TOP, ansible_env

PLAYBOOK = TOP / "playbooks" / "collect.yml"


def lab(tmp_path: Path) -> Path:
    lab_dir = tmp_path / "lab"
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "8"],
        check=True,
        capture_output=True,
        env={**ansible_env(tmp_path), "STETHOSCOPE_LAB_DIR": str(lab_dir)},
    )
    return lab_dir


def collect(tmp_path: Path, lab_dir: Path, dsn: str, timeout_s: float = 10) -> dict[str, list]:
    """Run collect.yml; return each host's stethoscope_metrics as the tree callback saw them."""
    tree = tmp_path / "tree"
    env = ansible_env(
        tmp_path,
        dsn,
        STETHOSCOPE_LAB_DIR=str(lab_dir),
        STETHOSCOPE_WRITE_TIMEOUT=str(timeout_s),
        ANSIBLE_CALLBACKS_ENABLED="aicluster.stethoscope.clickhouse,ansible.builtin.tree",
        ANSIBLE_CALLBACK_TREE_DIR=str(tree),
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(PLAYBOOK)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = {}
    for host_file in tree.iterdir():
        results[host_file.name] = json.loads(host_file.read_text()).get("stethoscope_metrics", [])
    return results


# collect.yml's fingerprint task stores one row per node per sweep (node_fingerprint_changes_total)
# besides the health sweep's, whose result is the last task's and so the one the tree callback keeps
FINGERPRINT_ROWS = 1


def stored_rows(dsn: str) -> dict[str, int]:
    with Store(dsn) as store:
        return dict(store.query("SELECT node_id, count() FROM stethoscope.metrics FINAL GROUP BY node_id"))


def test_sink_up_stores_exactly_what_the_modules_returned(tmp_path, tmp_dsn):
    lab_dir = lab(tmp_path)
    first = collect(tmp_path, lab_dir, tmp_dsn)
    assert sorted(first) == [f"node{i:02d}" for i in range(1, 9)]
    assert stored_rows(tmp_dsn) == {node: len(rows) + FINGERPRINT_ROWS for node, rows in first.items()}
    second = collect(tmp_path, lab_dir, tmp_dsn)
    assert stored_rows(tmp_dsn) == {
        node: len(first[node]) + len(second[node]) + 2 * FINGERPRINT_ROWS for node in first
    }
    with Store(tmp_dsn) as store:
        db = "stethoscope"
        nodes = store.query(f"SELECT node_id, rack, switch, groups FROM {db}.nodes FINAL ORDER BY node_id")
        facts = store.query(f"SELECT count() FROM {db}.facts WHERE collector = 'gpu'")[0][0]
        rates = dict(
            store.query(
                f"SELECT metric_name, max(value) FROM {db}.metrics FINAL WHERE metric_name IN "
                f"('rdma_qps_dropped_per_second', 'nvlink_error_rate_percent') GROUP BY metric_name"
            )
        )
    assert nodes[0] == ("node01", "rack1", "leaf1", ["gpu_nodes", "rack1"]) and len(nodes) == 8
    assert facts == 16  # one gpu fact per node per sweep
    # rates need two sweeps: the faulted nodes' counters grew between them
    assert rates["rdma_qps_dropped_per_second"] > 0 and rates["nvlink_error_rate_percent"] > 0


def test_sink_refusing_spools_then_replays_with_exact_counts(tmp_path, tmp_dsn):
    lab_dir = lab(tmp_path)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    down = collect(tmp_path, lab_dir, f"http://127.0.0.1:{closed}/stethoscope", timeout_s=5)
    spooled = Spool(tmp_path / "spool")
    down_total = sum(len(rows) for rows in down.values())
    assert down_total > 0 and spooled.pending_rows() >= down_total
    up = collect(tmp_path, lab_dir, tmp_dsn)
    assert spooled.pending() == []
    assert stored_rows(tmp_dsn) == {
        node: len(down[node]) + len(up[node]) + 2 * FINGERPRINT_ROWS for node in up
    }


@pytest.fixture
def hung_server():
    """Accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held, stop = [], threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_hung_sink_does_not_stall_the_play(tmp_path, hung_server):
    lab_dir = lab(tmp_path)
    results = collect(tmp_path, lab_dir, f"http://127.0.0.1:{hung_server}/stethoscope", timeout_s=2)
    assert Spool(tmp_path / "spool").pending_rows() >= sum(len(rows) for rows in results.values()) > 0
