"""RDMA pairs that meet: the client names its server's port, and each pair's RC retry and timeout
counters (the HCA's hw_counters, read before and after the client) are stored beside its latency."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar
from ansible.vars.manager import VariableManager

from ansible_collections.aicluster.stethoscope.plugins.module_utils import suite_network
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import Context
from stethoscope.catalog import Catalog
from stethoscope.diagnosis.engine import evaluate
from stethoscope.diagnosis.rules import load_rules
from stethoscope.store.client import Store
from stethoscope.store.result_rows import rows_from_result
from stethoscope.timeutil import now_ms

from conftest import FIXTURES, TOP, ansible_env, fixture_text

GPUD_SYSFS = FIXTURES / "public/sysfs/sys-class-infiniband-h100_gpud"
LAT = "public/perftest/ib_read_lat_roce_cx5_mlx5_0_spiderpool.txt"
COUNTERS = "sys/class/infiniband/mlx5_0/ports/1/hw_counters"


def test_the_client_connects_to_its_servers_own_port():
    argv = suite_network.client_argv("ib_write_lat", "10.0.0.2", "mlx5_0", 2, 1000, port=18517)
    assert argv == ["ib_write_lat", "-d", "mlx5_0", "-s", "2", "-n", "1000", "-F", "-p", "18517", "10.0.0.2"]


def hca_root(tmp_path):
    """A root holding the real gpud H100 capture's mlx5_0 (its RC counters all 0)."""
    root = tmp_path / "root"
    shutil.copytree(GPUD_SYSFS / "mlx5_0", root / "sys/class/infiniband/mlx5_0")
    return root


def replaying_context(root, output, grow):
    """A Context over `root` whose commands print `output` while the HCA counts `grow` (counter ->
    increase) during the run, as a port retrying under the benchmark would."""

    def runner(argv, timeout, env=None):
        for name, increase in grow.items():
            path = root / COUNTERS / name
            path.write_text("%d\n" % (int(path.read_text()) + increase))
        return 0, output, ""

    return Context(runner, shutil.which, root=str(root), timeout=60)


def test_a_pairs_rc_counter_deltas_are_stored_with_its_latency(tmp_path):
    root = hca_root(tmp_path)
    ctx = replaying_context(root, fixture_text(LAT), {"local_ack_timeout_err": 3, "packet_seq_err": 1})
    _bench, rows, _stability, detail = suite_network.run(
        ctx, ["ib_read_lat"], "10.0.0.2", "node02", "mlx5_0", 2, 1000, 1, {}, 3.0, port=18516, hca_port=1
    )
    values = {
        r["name"]: r["value"]
        for r in rows
        if r["labels"] == {"test": "ib_read_lat", "size": "2", "stat": "median"}
    }
    assert values["bench_rdma_rc_local_ack_timeouts"] == 3 and values["bench_rdma_rc_packet_seq_errors"] == 1
    assert values["bench_rdma_rc_rnr_nak_retries"] == 0 and values["bench_rdma_rc_out_of_sequence"] == 0
    assert "bench_rdma_latency_p99_us" in values
    assert detail["runs"][0]["rc_counters"] == {
        "local_ack_timeout_err": 3,
        "rnr_nak_retry_err": 0,
        "packet_seq_err": 1,
        "out_of_sequence": 0,
    }


def test_an_hca_without_rc_counters_stores_latency_and_says_so(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    ctx = replaying_context(root, fixture_text(LAT), {})
    _bench, rows, _stability, detail = suite_network.run(
        ctx, ["ib_read_lat"], "10.0.0.2", "node02", "mlx5_0", 2, 1000, 1, {}, 3.0, hca_port=1
    )
    assert not [r for r in rows if r["name"].startswith("bench_rdma_rc_")]
    assert detail["runs"][0]["rc_counters"] is None


@pytest.mark.parametrize("hca_port", [None])
def test_without_an_hca_port_no_counter_is_read(tmp_path, hca_port):
    ctx = replaying_context(hca_root(tmp_path), fixture_text(LAT), {"local_ack_timeout_err": 5})
    _bench, rows, _stability, _detail = suite_network.run(
        ctx, ["ib_read_lat"], "10.0.0.2", "node02", "mlx5_0", 2, 1000, 1, {}, 3.0, hca_port=hca_port
    )
    assert not [r for r in rows if r["name"].startswith("bench_rdma_rc_")]


def test_a_pair_is_labelled_for_its_class_and_its_peer_is_a_fact(tmp_path):
    ctx = replaying_context(hca_root(tmp_path), fixture_text(LAT), {})
    bench, _rows, _stability, detail = suite_network.run(
        ctx, ["ib_read_lat"], "10.0.0.2", "node02", "mlx5_0", 2, 1000, 1, {}, 3.0, port=18516, hca_port=1
    )
    assert {tuple(sorted(r["labels"])) for r in bench["results"]} == {("size", "test")}
    assert detail["ansible_facts"]["stethoscope_rdma_pair"]["peer"] == "node02"
    assert detail["runs"][0]["peer"] == "node02"


# --- the rules, fed the rows the module's results become in the store (the callback's rows_from_result) ---

CLASS = {"class_fingerprint": "c-h100-cx7", "node_fingerprint": "", "detail": {}}
RULES = {rule.rule_id: rule for rule in load_rules(TOP / "rules", Catalog.load()).rules}


def store_pair_run(store, tmp_path, node, grow, output=None):
    """One pair run on `node` by the suite (ib_read_lat, the real capture), stored as the callback does."""
    ctx = replaying_context(hca_root(tmp_path / node), output or fixture_text(LAT), grow)
    bench, rows, _stability, extra = suite_network.run(
        ctx, ["ib_read_lat"], "10.0.0.9", "peer-of-" + node, "mlx5_0", 2, 1000, 1,
        dict(CLASS, node_fingerprint="n-" + node), 3.0, port=18516, hca_port=1,
    )  # fmt: skip
    result = {"stethoscope_bench": bench, "stethoscope_metrics": rows, **extra}
    batch = rows_from_result(node, result, "run-1", now_ms() - 60_000)
    store.insert_rows("bench_results", batch.bench)


def fired(store, rule_id):
    return sorted((m.node_id, m.device) for m in evaluate(store, RULES[rule_id], now_ms()))


def test_a_pair_that_retried_where_its_class_did_not_is_found(store, tmp_path):
    for node in ("gpu01", "gpu02", "gpu03"):
        store_pair_run(store, tmp_path, node, {})
    store_pair_run(store, tmp_path, "gpu04", {"local_ack_timeout_err": 7, "rnr_nak_retry_err": 2})
    assert fired(store, "rdma_pair_rc_retries_above_class") == [("gpu04", "mlx5_0")]
    assert fired(store, "rdma_latency_above_fleet") == []


def test_a_pair_whose_p99_is_far_above_its_class_is_found(store, tmp_path):
    for node in ("gpu01", "gpu02", "gpu03"):
        store_pair_run(store, tmp_path, node, {})
    # the same real run with its tail doubled: p99 7.38 us read as 14.76 us (t_typical unchanged)
    text = fixture_text(LAT)
    slow_tail = text.replace(" 7.38 ", " 14.76 ")
    assert slow_tail != text
    store_pair_run(store, tmp_path, "gpu04", {}, slow_tail)
    # pairs of one class share their labels (test, size; the peer is a fact), so they form a fleet
    assert fired(store, "rdma_latency_above_fleet") == [("gpu04", "mlx5_0")]
    assert fired(store, "rdma_pair_rc_retries_above_class") == []


# --- baseline.yml on 16 lab nodes: perftest's stand-ins listen and connect on loopback for real ---

# The default batches (2 of 16 nodes) are checked below without a run; batches of 7 give an odd ring
# (7 RDMA nodes) and a node alone in its batch with no peer
BATCH = 7


def ansible_batches(hosts):
    """Ansible's own order of the play's hosts, cut into batches as `serial` does; the RDMA group."""
    inventory = InventoryManager(DataLoader(), [str(hosts)])
    order = [host.name for host in inventory.get_hosts("all")]
    return [order[i : i + BATCH] for i in range(0, len(order), BATCH)], set(
        inventory.get_groups_dict()["rdma_nodes"]
    )


def rings(batches, rdma):
    """(client, server) of each batch's ring of RDMA nodes, in batch order; a node alone has none."""
    pairs = set()
    for batch in batches:
        members = [node for node in batch if node in rdma]
        if len(members) > 1:
            pairs |= {(node, members[(i + 1) % len(members)]) for i, node in enumerate(members)}
    return pairs


def test_every_rdma_pair_meets_inside_its_batch_its_server_listening_first(tmp_path, tmp_dsn):
    lab = tmp_path / "lab"
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(lab))
    hosts = tmp_path / "inventory" / "hosts.yml"
    build = [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "16", "--inventory", str(hosts)]
    subprocess.run(build, env=env, check=True, capture_output=True)
    play = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(hosts),
            str(TOP / "playbooks/baseline.yml"),
            "-e",
            f"baseline_batch={BATCH}",
            "-e",
            '{"baseline_suites": ["network"], "bench_network_repetitions": 1}',
        ],
        env=env,
        cwd=TOP,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert play.returncode == 0, play.stdout[-4000:]
    batches, rdma = ansible_batches(hosts)
    batch_of = {node: index for index, batch in enumerate(batches) for node in batch}
    listening, pairs, served = {}, [], 0
    for line in (lab / "perftest.log").read_text().splitlines():
        event, port, node, _at = line.split()
        if event == "listen":
            listening[port] = node
        elif event == "connect":
            # the server was listening before its client connected (a client finding none is refused)
            server = listening.pop(port)
            assert batch_of[server] == batch_of[node], (node, server)
            pairs.append((node, server))
        else:
            served += 1
    expected = rings(batches, rdma)
    assert len(expected) == 7 and served == len(pairs) == 3 * len(expected)  # 3 tests, 1 repetition
    assert set(pairs) == expected
    (alone,) = rdma - {client for client, _server in expected}
    assert f"{alone} is unpaired" in play.stdout
    with Store(tmp_dsn) as store:
        measured = store.query(
            "SELECT DISTINCT node_id FROM stethoscope.bench_results WHERE suite = 'network' ORDER BY node_id"
        )
    assert {row[0] for row in measured} == rdma - {alone}


# --- the default batching, read from baseline.yml and the role and templated by Ansible, no run ---


def lab_inventory(tmp_path: Path, monkeypatch, count: int) -> Path:
    """tools/lab.py's inventory of `count` nodes (its RDMA nodes in the group rdma_nodes)."""
    monkeypatch.setenv("STETHOSCOPE_LAB_DIR", str(tmp_path / "lab"))
    spec = importlib.util.spec_from_file_location("lab_tool", TOP / "tools/lab.py")
    assert spec is not None and spec.loader is not None
    lab = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "lab_tool", lab)
    spec.loader.exec_module(lab)
    hosts = tmp_path / "inventory" / "hosts.yml"
    lab.write_inventory(count, hosts)
    return hosts


def loaded(loader: DataLoader, path: str) -> Any:
    return loader.load_from_file(str(TOP / path), trusted_as_template=True)


def tasks_of(item: Any):
    """Every task of a play or task list, blocks opened."""
    for task in item if isinstance(item, list) else [item]:
        yield task
        for key in ("tasks", "block", "always", "rescue"):
            if isinstance(task.get(key), list):
                yield from tasks_of(task[key])


def default_batches(
    loader: DataLoader, inventory: InventoryManager, magic: dict[str, Any]
) -> list[list[str]]:
    """baseline.yml's `serial` as Ansible templates it (no baseline_batch given), cut from Ansible's
    own order of the play's hosts."""
    (play,) = [play for play in loaded(loader, "playbooks/baseline.yml") if "serial" in play]
    size = int(Templar(loader=loader, variables=magic).template(play["serial"]))
    order = [host.name for host in inventory.get_hosts(play["hosts"])]
    return [order[i : i + size] for i in range(0, len(order), size)]


def batch_pairs(
    loader: DataLoader, magic: dict[str, Any], batch: list[str]
) -> list[tuple[str, str, int, int]]:
    """(client, server, the port the client connects to, the port its server listens on) of one batch,
    each templated from the bench_network role as baseline.yml includes it."""
    (include,) = [
        t for t in tasks_of(loaded(loader, "playbooks/baseline.yml"))
        if (t.get("ansible.builtin.include_role") or {}).get("name") == "aicluster.stethoscope.bench_network"
    ]  # fmt: skip
    role = {**loaded(loader, "roles/bench_network/defaults/main.yml"), **include.get("vars", {})}
    (find,) = [
        t
        for t in tasks_of(loaded(loader, "roles/bench_network/tasks/main.yml"))
        if "ansible.builtin.set_fact" in t
    ]
    batched = Templar(loader=loader, variables={**magic, **role, "ansible_play_batch": batch})
    members = batched.template(find["ansible.builtin.set_fact"]["__bench_network_members"])
    pair = loaded(loader, "roles/bench_network/tasks/pair.yml")
    (server,) = [t for t in pair if "async" in t]  # the perftest server, started in the background
    (client,) = [t for t in pair if "aicluster.stethoscope.bench_network" in t]
    facts = {**magic, **role, "__bench_network_members": members}

    def on(host: str, task: dict[str, Any], template: str) -> Any:
        return Templar(
            loader=loader, variables={**facts, **task["vars"], "inventory_hostname": host}
        ).template(template)

    pairs = []
    for node in members:
        peer = on(node, client, client["vars"]["_bench_network_peer"])
        connects = on(node, client, client["aicluster.stethoscope.bench_network"]["port"])
        listens = on(peer, server, server["ansible.builtin.command"]["argv"][-1])
        pairs.append((node, peer, int(connects), int(listens)))
    return pairs


def test_the_default_batches_of_sixteen_lab_nodes_are_pairs_that_meet_inside_them(tmp_path, monkeypatch):
    """baseline.yml's default batch (10 % of the inventory, at least 2) on the 16-node lab: batches of
    2, each RDMA node paired with the other node of its batch, its client on its server's port."""
    loader = DataLoader()
    inventory = InventoryManager(loader, [str(lab_inventory(tmp_path, monkeypatch, 16))])
    magic = VariableManager(loader=loader, inventory=inventory).get_vars()
    batches = default_batches(loader, inventory, magic)
    assert [len(batch) for batch in batches] == [2] * 8
    rdma = set(inventory.get_groups_dict()["rdma_nodes"])
    batch_of = {node: index for index, batch in enumerate(batches) for node in batch}
    pairs = [pair for batch in batches for pair in batch_pairs(loader, magic, batch)]
    for client, server, connects, listens in pairs:
        assert batch_of[client] == batch_of[server] and client != server, (client, server)
        assert connects == listens, (client, server)
    assert {client for client, *_ in pairs} == rdma  # none alone in its batch: every RDMA node measured


@pytest.mark.parametrize(("nodes", "batch"), [(3, 2), (16, 2), (25, 2), (40, 4)])
def test_the_default_batch_is_a_tenth_of_the_inventory_and_never_under_two(
    tmp_path, monkeypatch, nodes, batch
):
    loader = DataLoader()
    inventory = InventoryManager(loader, [str(lab_inventory(tmp_path, monkeypatch, nodes))])
    magic = VariableManager(loader=loader, inventory=inventory).get_vars()
    batches = default_batches(loader, inventory, magic)
    assert {len(b) for b in batches[:-1]} <= {batch} and 0 < len(batches[-1]) <= batch
    assert sum(len(b) for b in batches) == nodes
