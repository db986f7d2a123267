"""The ClickHouse callback in real ansible-playbook runs of collect.yml on the lab: a sink that is up,
refusing, and hung. The play never fails or stalls because of the sink, and nothing is lost."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from test_cli import cli

from stethoscope.store.client import Store
from stethoscope.store.spool import Spool

from conftest import TOP, ansible_env, database_held_elsewhere

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


def play(tmp_path: Path, lab_dir: Path, dsn: str, *args: str, timeout_s: float = 10, **env_extra: str):
    """Run ansible-playbook (collect.yml unless args name another); return the process and each host's
    final result as the tree callback saw it."""
    tree = tmp_path / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    env = ansible_env(
        tmp_path,
        dsn,
        STETHOSCOPE_LAB_DIR=str(lab_dir),
        STETHOSCOPE_WRITE_TIMEOUT=str(timeout_s),
        ANSIBLE_CALLBACKS_ENABLED="aicluster.stethoscope.clickhouse,ansible.builtin.tree",
        ANSIBLE_CALLBACK_TREE_DIR=str(tree),
        **env_extra,
    )
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), *(args or (str(PLAYBOOK),))],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = {}
    for host_file in tree.iterdir() if tree.is_dir() else []:
        results[host_file.name] = json.loads(host_file.read_text())
    return proc, results


def collect(tmp_path: Path, lab_dir: Path, dsn: str, timeout_s: float = 10) -> dict[str, list]:
    """Run collect.yml; return each host's stethoscope_metrics as the tree callback saw them."""
    proc, results = play(tmp_path, lab_dir, dsn, timeout_s=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {host: result.get("stethoscope_metrics", []) for host, result in results.items()}


def stored_rows(dsn: str) -> dict[str, int]:
    """Rows per node that came from the modules (the callback's own ansible_host_unreachable apart)."""
    with Store(dsn) as store:
        return dict(
            store.query(
                "SELECT node_id, count() FROM stethoscope.metrics FINAL "
                "WHERE metric_name != 'ansible_host_unreachable' GROUP BY node_id"
            )
        )


def unreachable_series(dsn: str) -> dict[str, list[float]]:
    with Store(dsn) as store:
        rows = store.query(
            "SELECT node_id, groupArray(value) FROM (SELECT node_id, value FROM stethoscope.metrics FINAL "
            "WHERE metric_name = 'ansible_host_unreachable' AND device = 'node' ORDER BY timestamp) "
            "GROUP BY node_id"
        )
    return {node: list(values) for node, values in rows}


def test_sink_up_stores_exactly_what_the_modules_returned(tmp_path, tmp_dsn):
    lab_dir = lab(tmp_path)
    first = collect(tmp_path, lab_dir, tmp_dsn)
    assert sorted(first) == [f"node{i:02d}" for i in range(1, 9)]
    assert stored_rows(tmp_dsn) == {node: len(rows) for node, rows in first.items()}
    second = collect(tmp_path, lab_dir, tmp_dsn)
    assert stored_rows(tmp_dsn) == {node: len(first[node]) + len(second[node]) for node in first}
    assert unreachable_series(tmp_dsn) == {node: [0.0, 0.0] for node in first}  # reached in both sweeps
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


def test_sink_busy_spools_then_the_next_run_replays_with_exact_counts(tmp_path, tmp_dsn):
    """The embedded database is held by another process during one sweep; the next sweep replays."""
    lab_dir = lab(tmp_path)
    with database_held_elsewhere(tmp_path / "db"):
        down = collect(tmp_path, lab_dir, tmp_dsn, timeout_s=2)
    spooled = Spool(tmp_path / "spool")
    down_total = sum(len(rows) for rows in down.values())
    assert down_total > 0 and spooled.pending_rows() >= down_total
    up = collect(tmp_path, lab_dir, tmp_dsn)
    assert spooled.pending() == []
    assert stored_rows(tmp_dsn) == {node: len(down[node]) + len(up[node]) for node in up}


def test_rows_spooled_for_a_refusing_server_stay_for_it(tmp_path, tmp_dsn):
    lab_dir = lab(tmp_path)
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    down = collect(tmp_path, lab_dir, f"http://127.0.0.1:{closed}/stethoscope", timeout_s=5)
    collect(tmp_path, lab_dir, tmp_dsn)
    left = Spool(tmp_path / "spool").status()
    assert {f.target for f in left} == {f"http://127.0.0.1:{closed} database stethoscope"}
    # besides the module's rows (the fingerprint's among them), each node's ansible_host_unreachable 0
    extra = len(down)
    assert (
        sum(f.rows for f in left if f.table == "metrics") == sum(len(rows) for rows in down.values()) + extra
    )


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


def test_hung_sink_costs_one_timeout_per_play_and_replay_into_stores_every_row(
    tmp_path, hung_server, tmp_dsn
):
    lab_dir = lab(tmp_path)
    hung = f"http://127.0.0.1:{hung_server}/stethoscope"
    # small batches: the play flushes after nearly every host, so each flush could wait for the sink
    proc, results = play(
        tmp_path, lab_dir, hung, "-vv", str(PLAYBOOK), timeout_s=2, STETHOSCOPE_BATCH_SIZE="20"
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    flushes = proc.stdout.count('"error": "')
    assert flushes > 3 and proc.stdout.count("write did not finish within 2 s") == 1
    assert "1 writes timed out" in proc.stderr + proc.stdout
    modules = {host: len(result["stethoscope_metrics"]) for host, result in results.items()}
    moved = cli("--spool-dir", str(tmp_path / "spool"), "spool", "replay", "--into", tmp_dsn)
    assert moved.returncode == 0, moved.stderr
    assert stored_rows(tmp_dsn) == modules
    assert unreachable_series(tmp_dsn) == {node: [0.0] for node in modules}


def test_loop_results_are_stored(tmp_path, tmp_dsn):
    lab_dir = lab(tmp_path)
    proc, results = play(tmp_path, lab_dir, tmp_dsn, str(TOP / "tests/playbooks/collect_loop.yml"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    expected = {
        host: sum(len(item.get("stethoscope_metrics", [])) for item in result["results"])
        for host, result in results.items()
    }
    assert sorted(expected) == ["node01", "node02"] and all(expected.values())
    assert stored_rows(tmp_dsn) == expected
    with Store(tmp_dsn) as store:
        collectors = store.query("SELECT DISTINCT collector FROM stethoscope.facts ORDER BY collector")
    assert [c for (c,) in collectors] == ["gpu", "smart", "tuning"]


def test_nan_inf_and_text_values_are_counted_kept_and_cost_only_their_own_row(tmp_path, tmp_dsn):
    proc, _ = play(tmp_path, tmp_path, tmp_dsn, str(TOP / "tests/playbooks/bad_values.yml"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    output = proc.stdout + proc.stderr
    assert "4 values not stored (Inf 1, NaN 1, not a number 2)" in " ".join(output.split())
    with Store(tmp_dsn) as store:
        kept = store.query(
            "SELECT metric_name, device, value FROM stethoscope.metrics FINAL "
            "WHERE metric_name != 'ansible_host_unreachable' ORDER BY metric_name, device"
        )
        bench = store.query("SELECT repetition, value FROM stethoscope.bench_results")
    assert kept == [("gpu_power_watts", "gpu0", 312.5), ("gpu_temperature_celsius", "gpu0", 41.0)]
    assert bench == [(1, 910000.0)]
    rejected = [
        json.loads(line)
        for path in sorted((tmp_path / "spool/rejected").glob("*.ndjson"))
        for line in path.read_text().splitlines()
    ]
    assert sorted((r["reason"], str(r["row"]["value"])) for r in rejected) == [
        ("Inf", "inf"),
        ("NaN", "nan"),
        ("not a number", "fast"),
        ("not a number", "n/a"),
    ]


def test_unreachable_host_is_stored_as_1_and_as_0_once_reached(tmp_path, tmp_dsn):
    lab_dir = tmp_path / "lab"
    inventory = tmp_path / "inventory"
    subprocess.run(
        [
            sys.executable,
            str(TOP / "tools/lab.py"),
            "build",
            "--nodes",
            "2",
            "--inventory",
            str(inventory / "hosts.yml"),
        ],
        check=True,
        capture_output=True,
        env={**ansible_env(tmp_path), "STETHOSCOPE_LAB_DIR": str(lab_dir)},
    )
    with socket.socket() as probe:  # a loopback port nothing listens on: ssh is refused at once
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    ghost = inventory / "ghost.yml"
    ghost.write_text(
        "all:\n  hosts:\n    ghost:\n      ansible_connection: ssh\n      ansible_host: 127.0.0.1\n"
        f"      ansible_port: {closed}\n      ansible_user: nobody\n"
        "      ansible_ssh_common_args: -o BatchMode=yes -o ConnectTimeout=5\n"
    )
    proc, _ = play(tmp_path, lab_dir, tmp_dsn, "-i", str(inventory), str(PLAYBOOK))
    assert proc.returncode == 4 and "UNREACHABLE" in proc.stdout, proc.stdout[-3000:]
    assert unreachable_series(tmp_dsn) == {"ghost": [1.0], "node01": [0.0], "node02": [0.0]}
    with Store(tmp_dsn) as store:
        assert store.query("SELECT node_id FROM stethoscope.nodes FINAL WHERE node_id = 'ghost'") == [
            ("ghost",)
        ]
    # the host comes back (here: reached locally, where its collector fails): the series resolves
    ghost.write_text("all:\n  hosts:\n    ghost:\n      ansible_connection: local\n")
    proc, _ = play(tmp_path, lab_dir, tmp_dsn, "-i", str(inventory), str(PLAYBOOK))
    assert "UNREACHABLE" not in proc.stdout, proc.stdout[-3000:]
    assert unreachable_series(tmp_dsn)["ghost"] == [1.0, 0.0]
