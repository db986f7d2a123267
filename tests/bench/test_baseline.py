"""The baseline report: fleet median per class, grading in the catalog's worse direction, own history,
the ring-vs-tree hint; and baseline.yml end to end on the lab, where one node is slow."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stethoscope.bench.baseline import FRESH_MS, build, render_table, verify, worse_deviation
from stethoscope.catalog import Catalog
from stethoscope.report.baseline_html import render_html
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP, ansible_env

CATALOG = Catalog.load()
# every lab node runs nccl-tests as 8 ranks on itself (inventories/lab: bench_nccl_gpus_per_node)
ONE_NODE_8_RANKS = {"ranks": "8", "topology": "1x8"}


def bench_row(run, node, metric, value, repetition=1, class_fp="c1", node_fp=None, labels=None, at=0):
    return {
        "run_id": run,
        "node_id": node,
        "suite": "storage",
        "metric_name": metric,
        "device": "nvme0n1",
        "labels": labels or {},
        "value": value,
        "unit": "",
        "repetition": repetition,
        "class_fingerprint": class_fp,
        "node_fingerprint": node_fp or node,
        "unstable": 0,
        "timestamp": now_ms() - 10_000_000 + at,
    }


def test_direction_of_worse():
    assert worse_deviation(80, 100, "higher") == 20 and worse_deviation(120, 100, "higher") == 0
    assert worse_deviation(130, 100, "lower") == 30 and worse_deviation(70, 100, "lower") == 0


def test_grades_history_and_instability(store):
    rows = []
    for node, iops in (("n1", 100.0), ("n2", 101.0), ("n3", 85.0), ("n4", 70.0), ("n5", 150.0)):
        rows += [bench_row("r9", node, "bench_fio_randread_iops", iops, rep, at=9000) for rep in (1, 2, 3)]
    for i, run in enumerate(("r1", "r2", "r3")):  # n4's own history: about 100, then 70 now
        rows += [bench_row(run, "n4", "bench_fio_randread_iops", 99.0 + i, 1, at=i * 1000)]
    rows += [
        bench_row("r9", "n1", "bench_fio_randread_latency_p99_us", v, rep, at=9000)
        for rep, v in ((1, 100.0), (2, 130.0), (3, 90.0))
    ]  # spread: unstable
    store.insert_rows("bench_results", rows)
    report = {(r.node_id, r.metric_name): r for r in build(store, CATALOG)}
    iops = {node: report[(node, "bench_fio_randread_iops")] for node in ("n1", "n2", "n3", "n4", "n5")}
    assert iops["n1"].fleet_median == 100.0 and iops["n1"].fleet_nodes == 5
    assert {n: r.grade for n, r in iops.items()} == {
        "n1": "green",
        "n2": "green",
        "n3": "yellow",
        "n4": "red",
        "n5": "green",
    }  # faster is not degraded
    assert iops["n4"].beyond_3_sigma and iops["n4"].history_runs == 3
    assert report[("n1", "bench_fio_randread_latency_p99_us")].unstable
    table = render_table(build(store, CATALOG))
    assert "RED" in table and "unstable (RSD" in table and ">3σ from own history" in table


def test_a_swapped_part_starts_a_new_history(store):
    rows = [
        bench_row(run, "n1", "bench_fio_randread_iops", 100.0, node_fp="old", at=i)
        for i, run in enumerate("abc")
    ]
    rows += [bench_row("d", "n1", "bench_fio_randread_iops", 60.0, node_fp="new", at=10)]
    store.insert_rows("bench_results", rows)
    (row,) = build(store, CATALOG)
    assert row.history_runs == 0 and not row.beyond_3_sigma


def test_a_node_name_with_markup_is_escaped_in_the_baseline_html(store):
    hostile = "<script>alert(1)</script>"
    rows = [
        bench_row(f"r-{node}", node, "bench_fio_randread_iops", value, labels={"tag": '"><img src=x>'})
        for node, value in [(hostile, 50.0), ("n2", 100.0), ("n3", 101.0)]
    ]
    store.insert_rows("bench_results", rows)
    page = render_html(build(store, CATALOG))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and hostile not in page
    assert "&#34;&gt;&lt;img src=x&gt;" in page and "<img" not in page
    assert page.count("<script>") == 1  # the page's own sorting code, nothing from the data


def test_baseline_playbook_on_the_lab_grades_the_slow_node_red(tmp_path, tmp_dsn):
    lab_dir = tmp_path / "lab"
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(lab_dir))
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build"], env=env, check=True, capture_output=True
    )
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            str(TOP / "playbooks/baseline.yml"),
            "-e",
            "baseline_batch=4",
            "-e",
            "bench_nccl_repetitions=2",
            "-e",
            "bench_storage_repetitions=2",
            "-e",
            "bench_network_repetitions=1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    with Store(tmp_dsn) as store:
        rows = build(store, CATALOG)
        suites = dict(
            store.query("SELECT suite, uniqExact(node_id) FROM stethoscope.bench_results GROUP BY suite")
        )
        fingerprints = store.query("SELECT count() FROM stethoscope.fingerprints FINAL WHERE kind = 'class'")[
            0
        ][0]
    assert suites == {"compute": 8, "nccl": 8, "storage": 8, "network": 4} and fingerprints >= 3
    # compute on CPU stand-ins: every node's 2 stand-in devices graded, labelled as stand-ins
    standins = {
        (r.node_id, r.device) for r in rows if r.suite == "compute" and r.labels.get("standin") == "cpu"
    }
    assert standins == {(f"node{i:02d}", f"cpu{d}") for i in range(1, 9) for d in (0, 1)}
    # 8 nodes share this machine's 2 cores, so stand-in throughput is not graded here; the rest is
    red = {(r.node_id, r.suite) for r in rows if r.grade == "red" and r.suite != "compute"}
    assert red == {("node03", "nccl"), ("node03", "storage")}
    (ring,) = [
        r
        for r in rows
        if r.node_id == "node03" and r.labels == {**ONE_NODE_8_RANKS, "algo": "ring", "size": "avg"}
    ]
    assert ring.hints == ["ring degraded while tree is normal: suspect switch port congestion"]
    (tree,) = [
        r
        for r in rows
        if r.node_id == "node03" and r.labels == {**ONE_NODE_8_RANKS, "algo": "tree", "size": "avg"}
    ]
    assert tree.grade == "green"
    assert '<tr class="red"><td class="g">red</td><td>node03</td>' in render_html(rows)
    with Store(tmp_dsn) as store:
        (facts,) = store.query(
            "SELECT facts FROM stethoscope.facts WHERE node_id = 'node08' AND collector = "
            "'env_lock' AND facts LIKE '%locked%' LIMIT 1"
        )[0]
    # node08's ib0 is at 4096 while mlx5_1's port runs 2048: reported, ready for a rule
    assert '"ib_active_mtu": 2048' in facts and '"port": "mlx5_1/1"' in facts
    # the environment was put back after the suites: the lab's NVMe write cache is on again
    assert (lab_dir / "nodes/node01/outputs/SYNTHETIC_nvme0_vwc").read_text().strip() == "1"
    # no scheduler in the lab: said once, and every node ran; no fio scratch file left behind
    assert proc.stdout.count("the inventory names no scheduler") == 1
    decided = [f"baseline preflight node0{i}: run: no scheduler configured" for i in range(1, 9)]
    assert all(line in proc.stdout for line in decided)
    assert not list(lab_dir.glob("nodes/*/scratch.fio"))
    # the storage suite's file preconditioned first, then read, then written for the cliff (the lab's
    # 20 s run: none within it, its length stored), on every node
    assert all(f"{lab_dir}/nodes/node0{i}/scratch.fio: steady state" in proc.stdout for i in range(1, 9))
    with Store(tmp_dsn) as store:
        cliffs = store.query(
            "SELECT metric_name, value, labels['runtime'], uniqExact(node_id) FROM stethoscope.bench_results "
            "WHERE metric_name LIKE 'bench_fio_latency_jump%' GROUP BY metric_name, value, labels['runtime'] "
            "ORDER BY metric_name"
        )
    assert cliffs == [
        ("bench_fio_latency_jump_seconds", 20.0, "20", 8),
        ("bench_fio_latency_jumped", 0.0, "20", 8),
    ]


def run_rows(run, node, value, at, suite="storage", class_fp="c1", metric="bench_fio_randread_iops"):
    rows = [bench_row(run, node, metric, value, rep, class_fp=class_fp, at=at) for rep in (1, 2, 3)]
    for row in rows:
        row["suite"] = suite
    return rows


DRAIN_AT = 5_000  # offsets inside bench_row's timeline


def drained_at_ms(store) -> int:
    return now_ms() - 10_000_000 + DRAIN_AT


def test_verify_of_a_class_of_one_is_not_green_by_comparing_with_itself(store):
    # an RMA'd GPU with another VBIOS: the node alone in a new class, benchmarked after the drain
    store.insert_rows("bench_results", run_rows("r1", "n1", 50.0, 9000, class_fp="new-vbios"))
    result = verify(store, CATALOG, "n1", drained_at_ms(store), now_ms())
    assert not result["green"] and [c.reference for c in result["checks"]] == ["none"]
    assert "no reference (only 0 other node(s) of its class" in result["reasons"][0]


def test_verify_compares_with_three_fresh_peers_excluding_itself(store):
    rows = run_rows("r1", "n1", 70.0, 9000)
    for peer in ("p1", "p2", "p3"):
        rows += run_rows(f"{peer}-r", peer, 100.0, 8000)
    store.insert_rows("bench_results", rows)
    (check,) = verify(store, CATALOG, "n1", drained_at_ms(store), now_ms())["checks"]
    assert (check.reference, check.reference_value, check.grade) == ("class", 100.0, "red")


def test_verify_falls_back_to_own_history_when_the_class_median_degraded(store):
    rows = []
    for i, peer in enumerate(("p1", "p2", "p3")):  # the peers were at 100, now at 60: the class degraded
        rows += run_rows(f"{peer}-old", peer, 100.0, 0 + i)
        rows += run_rows(f"{peer}-new", peer, 60.0, 8000 + i)
    for i in range(3):  # n1's own runs before the drain
        rows += run_rows(f"n1-old{i}", "n1", 99.0 + i, 1000 + i)
    rows += run_rows("n1-new", "n1", 100.0, 9000)
    store.insert_rows("bench_results", rows)
    now = now_ms()
    result = verify(store, CATALOG, "n1", drained_at_ms(store), now - 10_000_000 + 7_000 + FRESH_MS)
    (check,) = result["checks"]
    assert (check.reference, check.grade) == ("own history", "green") and result["green"]
    assert "the class median itself degraded 40.0 % against its own history" in result["reasons"][0]


def test_verify_needs_every_suite_newer_than_the_drain(store):
    rows = run_rows("r-new", "n1", 100.0, 9000, suite="storage")
    rows += run_rows("r-old", "n1", 100.0, 100, suite="nccl", metric="bench_allreduce_busbw_gb_per_s")
    for peer in ("p1", "p2", "p3"):
        rows += run_rows(f"{peer}-s", peer, 100.0, 8000, suite="storage")
        rows += run_rows(
            f"{peer}-n", peer, 100.0, 8000, suite="nccl", metric="bench_allreduce_busbw_gb_per_s"
        )
    store.insert_rows("bench_results", rows)
    result = verify(store, CATALOG, "n1", drained_at_ms(store), now_ms())
    assert result["stale_suites"] == ["nccl"] and not result["green"]
    assert "suite nccl has not run since the drain" in result["reasons"]


def checksum_rows(node, value, class_fp="c1", device="gpu3"):
    row = bench_row(f"{node}-run", node, "bench_gemm_checksum", value, class_fp=class_fp, at=9000)
    gemm = bench_row(f"{node}-run", node, "bench_gemm_tflops", 700.0, class_fp=class_fp, at=9000)
    for r in (row, gemm):
        r.update(suite="compute", device=device)
    row["labels"] = {"dtype": "bf16", "size": "8192", "gpu": "3"}
    gemm["labels"] = {"dtype": "bf16", "size": "8192", "gpu": "3", "mode": "burst"}
    return [row, gemm]


def test_checksum_quorum_across_the_class_names_the_odd_gpu_and_a_tie_is_no_verdict(store):
    rows = []
    for node in ("n1", "n2", "n3"):
        rows += checksum_rows(node, 4242.0)
    rows += checksum_rows("n4", 4243.0)  # one bit off
    rows += checksum_rows("t1", 1.0, class_fp="c2") + checksum_rows("t2", 2.0, class_fp="c2")
    rows += checksum_rows("t3", 1.0, class_fp="c2") + checksum_rows("t4", 2.0, class_fp="c2")  # 2 vs 2
    store.insert_rows("bench_results", rows)
    from stethoscope.bench.baseline import quorum_suspects

    assert quorum_suspects(store) == {("n4", "gpu3"): ["bf16"]}
    (gemm,) = [r for r in build(store, CATALOG) if r.node_id == "n4" and r.metric_name == "bench_gemm_tflops"]
    assert any("suspect silent data corruption" in hint for hint in gemm.hints)


def test_below_siblings_percent_is_not_fleet_graded(store):
    # a node-internal comparison (a rule judges it): against the fleet's median of ~0 % it read RED
    rows = [
        bench_row("r1", node, "bench_gemm_below_siblings_percent", value, at=10)
        for node, value in (("n1", 0.0), ("n2", 0.5), ("n3", 0.2), ("n4", 3.0))
    ]
    rows += [bench_row("r1", n, "bench_fio_randread_iops", 100.0, at=10) for n in ("n1", "n2", "n3")]
    store.insert_rows("bench_results", rows)
    graded = {r.metric_name for r in build(store, CATALOG)}
    assert graded == {"bench_fio_randread_iops"}


def test_the_table_shows_a_long_label_whole(store):
    # NCCL's labels as suite_nccl emits them: cut at 33 characters, 16 GiB read as 1717 bytes
    labels = {"algo": "ring", "size": "17179869184", "placement": "oop"}
    rows = [
        {**bench_row("r1", node, "bench_allreduce_busbw_gb_per_s", busbw, labels=labels), "suite": "nccl"}
        for node, busbw in (("gpu-node-0001", 180.0), ("gpu-node-0002", 181.0), ("gpu-node-0003", 90.0))
    ]
    store.insert_rows("bench_results", rows)
    table = render_table(build(store, CATALOG)).splitlines()
    (slow,) = [line for line in table if "gpu-node-0003" in line]
    assert "algo=ring,placement=oop,size=17179869184 " in slow
    assert slow.startswith("RED") and table[0].index("value") < slow.index("90")


def test_ring_and_tree_are_paired_within_one_topology(store):
    """A batch's 2x8 run (ring degraded, tree normal) and each node's own 1x8 run (both normal) are
    compared with like runs only, and the ring-vs-tree hint reads the 2x8 pair, not a mix."""
    rows = []
    for topology, ranks in (("1x8", "8"), ("2x8", "16")):
        for algo in ("ring", "tree"):
            labels = {"algo": algo, "size": "avg", "ranks": ranks, "topology": topology}
            for node in ("n1", "n2", "n3", "n4"):
                value = 140.0 if (node == "n4" and algo == "ring" and topology == "2x8") else 200.0
                row = bench_row("r1", node, "bench_allreduce_busbw_gb_per_s", value, labels=labels)
                rows.append({**row, "suite": "nccl", "device": "node"})
    store.insert_rows("bench_results", rows)
    report = {(r.node_id, r.labels["algo"], r.labels["topology"]): r for r in build(store, CATALOG)}
    assert report[("n4", "ring", "2x8")].grade != "green" and report[("n4", "ring", "1x8")].grade == "green"
    assert report[("n4", "ring", "2x8")].fleet_nodes == 4  # its fleet: the 2x8 runs, not the 1x8 ones
    assert report[("n4", "ring", "2x8")].hints == [
        "ring degraded while tree is normal: suspect switch port congestion"
    ]
    assert report[("n4", "ring", "1x8")].hints == []
