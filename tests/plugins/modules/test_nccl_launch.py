"""NCCL with one rank per GPU and across nodes: the launcher's argv (exact lists), the rank count and
topology read from real multi-rank nccl-tests output, and runs that cannot measure a bus refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils import nccl_launch, suite_nccl
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nccl_tests import parse_nccl_tests
from stethoscope.catalog import default_catalog
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import rules_dir
from stethoscope.store.client import Store

from conftest import FIXTURES, TOP, ansible_env, fake_tools, fixture_text, run_module

SWEEP = ["-b", "8", "-e", "2G", "-f", "2"]
A100_8 = "public/nccl-tests/all_reduce_perf_8xA100-SXM4-80GB_nccl2.16.2_gcm.txt"
A100_2X8 = "public/nccl-tests/all_reduce_perf_2node_16xA100-SXM4-80GB_nccl2.12.12_gcm.txt"
H100_2X8_SRUN = "public/nccl-tests/all_reduce_perf_srun_label_validation_off_2node_16xH100_ib_issue290.txt"
T4_2X1_MPIRUN = (
    "public/nccl-tests/all_reduce_perf_mpirun_tag_output_2node_T4_efa_nccl2.12.7_eks_blueprints.txt"
)


def test_one_node_runs_one_rank_per_gpu_with_nccl_tests_own_g():
    launch = nccl_launch.plan("none", "all_reduce_perf", SWEEP, 8, ["node01"])
    assert launch["argv"] == ["all_reduce_perf", "-b", "8", "-e", "2G", "-f", "2", "-g", "8"]
    assert (launch["ranks"], launch["nodes"], launch["topology"]) == (8, 1, "1x8")


def test_mpirun_over_a_batch_starts_one_process_per_gpu_from_a_hostfile():
    launch = nccl_launch.plan(
        "mpirun", "all_reduce_perf", SWEEP, 8, ["node01", "node02"], ["--mca", "btl", "^openib"], "/tmp/hf"
    )
    assert launch["argv"] == [
        "mpirun", "--hostfile", "/tmp/hf", "-np", "16", "--map-by", "ppr:8:node", "--tag-output",
        "-x", "NCCL_ALGO", "--mca", "btl", "^openib",
        "all_reduce_perf", "-b", "8", "-e", "2G", "-f", "2", "-g", "1",
    ]  # fmt: skip
    assert nccl_launch.hostfile_text(["node01", "node02"], 8) == "node01 slots=8\nnode02 slots=8\n"
    assert (launch["ranks"], launch["topology"]) == (16, "2x8")


def test_srun_over_a_batch_names_its_nodes():
    launch = nccl_launch.plan(
        "srun", "all_reduce_perf", SWEEP, 8, ["node01", "node02", "node03"], ["--mpi=pmix"]
    )
    assert launch["argv"] == [
        "srun", "--nodelist", "node01,node02,node03", "--nodes", "3", "--ntasks-per-node", "8", "--label",
        "--mpi=pmix", "all_reduce_perf", "-b", "8", "-e", "2G", "-f", "2", "-g", "1",
    ]  # fmt: skip
    assert (launch["ranks"], launch["topology"]) == (24, "3x8")


@pytest.mark.parametrize(
    ("launcher", "gpus", "hosts", "why"),
    [
        ("none", 1, ["node01"], "all_reduce_perf with 1 rank (1x1): an all-reduce of one rank moves nothing"),
        ("srun", 1, ["node01"], "with 1 rank (1x1)"),
        ("none", 8, ["node01", "node02"], "over 2 nodes needs a launcher (mpirun or srun)"),
        ("torchrun", 8, ["node01"], "launcher 'torchrun' is not one of none, mpirun, srun"),
    ],
)
def test_a_run_that_cannot_measure_a_bus_is_refused(launcher, gpus, hosts, why):
    with pytest.raises(nccl_launch.LaunchRefused, match=why.replace("(", r"\(").replace(")", r"\)")):
        nccl_launch.plan(launcher, "all_reduce_perf", SWEEP, gpus, hosts, hostfile="/tmp/hf")


def test_args_that_set_the_gpu_count_are_refused():
    with pytest.raises(nccl_launch.LaunchRefused, match="args carry -g"):
        nccl_launch.plan("none", "all_reduce_perf", [*SWEEP, "-g", "1"], 8, ["node01"])


@pytest.mark.parametrize(
    ("fixture", "ranks", "nodes"),
    [(A100_8, 8, 1), (A100_2X8, 16, 2), (H100_2X8_SRUN, 16, 2), (T4_2X1_MPIRUN, 2, 2)],
)
def test_the_rank_count_and_nodes_are_read_from_real_multi_rank_output(fixture, ranks, nodes):
    parsed = parse_nccl_tests(fixture_text(fixture))
    assert (parsed["ranks"], len(parsed["rank_hosts"])) == (ranks, nodes)


class ReplayContext:
    """The module Context's run(): one recorded output for every command, the argv kept."""

    timeout = 600

    def __init__(self, text):
        self.text, self.argv = text, []

    def run(self, argv, env=None):
        self.argv.append((list(argv), dict(env or {})))
        return 0, self.text, ""


def run_suite(text, launch):
    return suite_nccl.run(ReplayContext(text), "all_reduce_perf", ["Ring", "Tree"], launch, 1, {}, 3.0)


def test_results_carry_the_rank_count_and_topology_of_a_two_node_run():
    launch = nccl_launch.plan("srun", "all_reduce_perf", SWEEP, 8, ["node005", "node006"])
    _bench, rows, _stability, detail = run_suite(fixture_text(H100_2X8_SRUN), launch)
    (ring_avg,) = [r for r in rows if r["labels"].get("size") == "avg" and r["labels"]["algo"] == "ring"]
    assert ring_avg["value"] == 142.735
    assert ring_avg["labels"] == {
        "algo": "ring",
        "size": "avg",
        "ranks": "16",
        "topology": "2x8",
        "stat": "median",
    }
    assert {(r["ranks"], r["topology"]) for r in detail["runs"]} == {(16, "2x8")}


def test_output_with_fewer_ranks_than_asked_is_an_error_naming_the_run():
    launch = nccl_launch.plan("none", "all_reduce_perf", SWEEP, 4, ["node01"])
    with pytest.raises(
        CollectorError, match=r"all_reduce_perf \(NCCL_ALGO=Ring, 1x4\): asked for 4 ranks, 8 ran"
    ):
        run_suite(fixture_text(A100_8), launch)


def test_a_bus_bandwidth_of_zero_is_an_error_never_a_baseline():
    zeroed = fixture_text(A100_8).replace("# Avg bus bandwidth    : 210.99", "# Avg bus bandwidth    : 0")
    assert zeroed != fixture_text(A100_8)
    launch = nccl_launch.plan("none", "all_reduce_perf", SWEEP, 8, ["node01"])
    with pytest.raises(CollectorError, match=r"NCCL_ALGO=Ring, 1x8\): average bus bandwidth 0"):
        run_suite(zeroed, launch)


def test_the_time_per_size_is_stored_per_placement_with_its_median_and_max_never_a_p99():
    """Regression: the time per size was stored without its placement, so the AllReduce latency rules
    (which read the out-of-place time) matched nothing a run stored. nccl-tests prints one time per
    size, the mean of its iterations: over 3 repetitions the worst is the max, named so."""
    launch = nccl_launch.plan("none", "all_reduce_perf", SWEEP, 8, ["node01"])
    bench, rows, _stability, _detail = suite_nccl.run(
        ReplayContext(fixture_text(A100_8)), "all_reduce_perf", ["Ring"], launch, 3, {}, 3.0
    )
    size = {"algo": "ring", "size": "33554432", "ranks": "8", "topology": "1x8"}
    timed = {
        (r["labels"].get("placement"), r["labels"]["stat"]): r["value"]
        for r in rows
        if r["name"] == "bench_allreduce_latency_us" and r["labels"].items() >= size.items()
    }
    # the capture's row: 344.8 us out of place, 349.5 us in place
    assert timed == {
        ("oop", "median"): 344.8,
        ("oop", "max"): 344.8,
        ("ip", "median"): 349.5,
        ("ip", "max"): 349.5,
    }
    measured = [m for m in bench["results"] if m["metric_name"] == "bench_allreduce_latency_us"]
    assert len(measured) == 3 * 2 * 6  # repetitions x placements x the capture's sizes
    emitted: dict[str, list[dict[str, str]]] = {}
    for m in bench["results"]:
        emitted.setdefault(m["metric_name"], []).append(m["labels"])
    # every rule that reads the suite's metrics finds rows with the labels it filters on
    for rule in load_rules(rules_dir(), default_catalog()).rules:
        for condition in rule.conditions:
            wanted = dict(condition.labels)
            stored = emitted.get(condition.metric, [wanted])
            assert any(labels.items() >= wanted.items() for labels in stored), (rule.rule_id, wanted)


# --- the module, run by Ansible, nccl-tests and its launchers replayed at the process boundary ---


def test_the_module_launches_a_two_node_run_through_mpirun_with_its_hostfile(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    # the stand-in keeps the hostfile it was given (the argument after --hostfile) and replays the run
    fake_tools(bindir, log, {"mpirun": f'cat "$2" >> "{log}"; cat "{FIXTURES / A100_2X8}"'})
    result = run_module(
        tmp_path,
        "bench_nccl",
        {
            "launcher": "mpirun",
            "hosts": ["gpu1", "gpu2"],
            "gpus_per_node": 8,
            "repetitions": 1,
            "algos": ["Ring"],
        },
        bindir,
    )
    assert not result.get("failed"), result.get("msg")
    argv, *hostfile = log.read_text().splitlines()
    words = argv.split()
    assert words[:2] == ["mpirun", "--hostfile"] and words[2].endswith("/nccl-hostfile")
    assert words[3:] == [
        "-np", "16", "--map-by", "ppr:8:node", "--tag-output", "-x", "NCCL_ALGO",
        "all_reduce_perf", "-b", "8", "-e", "2G", "-f", "2", "-g", "1",
    ]  # fmt: skip
    assert hostfile == ["gpu1 slots=8", "gpu2 slots=8"]
    (avg,) = [r for r in result["stethoscope_metrics"] if r["labels"]["size"] == "avg"]
    assert avg["value"] == 150.209 and (avg["labels"]["ranks"], avg["labels"]["topology"]) == ("16", "2x8")


def test_the_module_refuses_one_rank_before_running_anything(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(bindir, log, {"all_reduce_perf": f'cat "{FIXTURES / A100_8}"'})
    result = run_module(tmp_path, "bench_nccl", {"gpus_per_node": 1}, bindir)
    assert result["failed"] and "all_reduce_perf with 1 rank (1x1)" in result["msg"]
    assert "refused, never a baseline" in result["msg"] and not log.exists()


def test_a_batch_run_is_stored_as_each_participants_own(tmp_path):
    bindir, log = tmp_path / "bin", tmp_path / "argv.log"
    fake_tools(bindir, log, {"srun": f'cat "{FIXTURES / H100_2X8_SRUN}"'})
    launched = run_module(
        tmp_path,
        "bench_nccl",
        {"launcher": "srun", "hosts": ["node005", "node006"], "gpus_per_node": 8, "repetitions": 1},
        bindir,
    )
    assert launched["stethoscope_bench"]["class_fingerprint"] == ""
    fingerprint = {"class_fingerprint": "c-h100x8", "node_fingerprint": "n-node006", "detail": {}}
    stored = run_module(tmp_path, "bench_nccl", {"record": launched, "fingerprint": fingerprint}, bindir)
    assert stored["stethoscope_bench"]["node_fingerprint"] == "n-node006"
    assert stored["stethoscope_bench"]["results"] == launched["stethoscope_bench"]["results"]
    assert stored["stethoscope_metrics"] == launched["stethoscope_metrics"] and stored["recorded_from_run"]
    srun = "srun --nodelist node005,node006 --nodes 2 --ntasks-per-node 8 --label"
    assert log.read_text().splitlines() == [srun + " all_reduce_perf -b 8 -e 2G -f 2 -g 1"] * 2
    # Ring and Tree, launched once; the record ran nothing


# --- the batch entry point on the lab: the real role and module, the callback and the store ---

BATCH_PLAY = """
- name: One all-reduce over a batch of two lab nodes
  hosts: node01:node02
  gather_facts: false
  tasks:
    - name: Run the batch's all-reduce and store it on both
      ansible.builtin.include_role:
        name: aicluster.stethoscope.bench_nccl
        tasks_from: batch
      vars:
        bench_nccl_launcher: {launcher}
        bench_nccl_repetitions: 1
"""


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_a_batch_all_reduce_on_the_lab_is_stored_on_each_node_with_its_shape(tmp_path, tmp_dsn, launcher):
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"))
    lab = [sys.executable, str(TOP / "tools/lab.py"), "build"]
    subprocess.run(lab, env=env, check=True, capture_output=True)
    playbook = tmp_path / "batch.yml"
    playbook.write_text(BATCH_PLAY.format(launcher=launcher))
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    play = subprocess.run(
        [ansible_playbook, str(playbook)], env=env, cwd=TOP, capture_output=True, text=True, check=False
    )
    assert play.returncode == 0, play.stdout[-4000:]
    with Store(tmp_dsn) as store:
        stored = store.query(
            "SELECT node_id, labels['algo'], labels['ranks'], labels['topology'], value "
            "FROM stethoscope.bench_results WHERE suite = 'nccl' AND labels['size'] = 'avg' ORDER BY 1, 2"
        )
    # the real 2-node, 16-rank capture the lab's launcher stand-ins replay (Avg bus bandwidth 150.209)
    assert [tuple(row) for row in stored] == [
        (node, algo, "16", "2x8", 150.209) for node in ("node01", "node02") for algo in ("ring", "tree")
    ]


NON_MPI_16 = (
    "public/nccl-tests/all_reduce_perf_mpirun_np16_nonMPI_build_each_1_rank_busbw0_2xH100_issue294.txt"
)


def test_sixteen_processes_of_one_rank_each_are_refused_naming_the_rank_count():
    # nccl-tests built without MPI=1 under mpirun -np 16: 16 one-rank runs, busbw 0.00, "nranks 1"
    parsed = parse_nccl_tests(fixture_text(NON_MPI_16))
    assert (parsed["ranks"], parsed["avg_busbw_gb_per_s"], parsed["failed"]) == (1, 0.0, False)
    launch = nccl_launch.plan("mpirun", "all_reduce_perf", SWEEP, 8, ["h100-2", "h100-4"], hostfile="/tmp/hf")
    with pytest.raises(
        CollectorError, match=r"all_reduce_perf \(NCCL_ALGO=Ring, 2x8\): asked for 16 ranks, 1 ran"
    ):
        run_suite(fixture_text(NON_MPI_16), launch)


def test_a_run_listing_no_ranks_with_bus_bandwidth_0_is_refused():
    text = "\n".join(line for line in fixture_text(NON_MPI_16).splitlines() if "NCCL INFO" not in line)
    launch = nccl_launch.plan("mpirun", "all_reduce_perf", SWEEP, 8, ["h100-2", "h100-4"], hostfile="/tmp/hf")
    with pytest.raises(CollectorError, match=r"2x8\): average bus bandwidth 0: nothing crossed a bus"):
        run_suite(text, launch)


def test_baseline_yml_runs_each_node_on_its_gpus_and_each_batch_across_its_nodes(tmp_path, tmp_dsn):
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"))
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build"], env=env, check=True, capture_output=True
    )
    extra = {"baseline_suites": ["nccl"], "bench_nccl_launcher": "mpirun", "bench_nccl_repetitions": 1}
    play = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            str(TOP / "playbooks/baseline.yml"),
            "-e",
            "baseline_batch=2",
            "-e",
            json.dumps(extra),
        ],
        env=env,
        cwd=TOP,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert play.returncode == 0, play.stdout[-4000:]
    with Store(tmp_dsn) as store:
        shapes = store.query(
            "SELECT labels['topology'], labels['ranks'], uniqExact(node_id), groupUniqArray(value) "
            "FROM stethoscope.bench_results WHERE suite = 'nccl' AND labels['size'] = 'avg' "
            "GROUP BY 1, 2 ORDER BY 1"
        )
    # every node's own 8 ranks (the real 8-GPU capture; node03's ring slowed by the lab's fault) and
    # its batch's 16 ranks over two nodes (the real 2-node capture), stored on both nodes of each batch
    assert [(topology, ranks, nodes) for topology, ranks, nodes, _values in shapes] == [
        ("1x8", "8", 8),
        ("2x8", "16", 8),
    ]
    assert sorted(shapes[1][3]) == [150.209]
