"""baseline.yml never runs under a job: the preflight's decisions on real `scontrol` output, and the
playbook against a real slurmctld with one real slurmd (node01), so `sbatch --wrap 'sleep 300'` gives
a real ALLOCATED/DRAINING node; node02 and node03 have no slurmd (never responded: `*`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.slurm import (
    out_of_service,
    parse_show_node,
    preflight_decision,
)
from stethoscope.store.client import Store

from conftest import TOP, ansible_env, fixture_text, slurm_with_slurmd

TXN = "bltest1"
OURS = f"stethoscope: baseline {TXN}"
LOCKED = "TASK [aicluster.stethoscope.env_lock : Set the environment to locked]"  # runs only if a node does


def node(state: str, reason: str = "", name: str = "node01") -> dict:
    parts = state.split("+")
    drain = any(p in ("DRAIN", "DRAINING", "DRAINED") for p in parts[1:])
    return {"name": name, "state": parts[0], "flags": parts[1:], "drained": drain, "reason": reason}


@pytest.mark.parametrize(
    "state, reason, action",
    [
        ("IDLE", "", "drain"),
        ("IDLE+DRAIN", OURS, "run"),
        ("ALLOCATED+DRAIN", OURS, "resume"),  # DRAINING: a job is still there
        ("MIXED+DRAIN", OURS, "resume"),
        ("IDLE+DRAIN", "stethoscope: ssd_reallocated_sectors 1a2b3c", "run"),  # left for verify
        ("IDLE+DRAIN", "maintenance by ops", "skip"),
        ("IDLE+DRAIN", "stethoscope: baseline othertxn", "skip"),  # another baseline's drain
    ],
)
def test_preflight_decision_per_slurm_state(state, reason, action):
    assert preflight_decision(node(state, reason), OURS)[0] == action


@pytest.mark.parametrize("fixture", ["never_responded", "drained", "drained_by_a_human", "resumed"])
def test_a_node_that_never_responded_is_skipped_not_drained(fixture):
    real = parse_show_node(fixture_text(f"real/slurm/scontrol_-o_show_node_{fixture}.txt"))
    action, why = preflight_decision(real, OURS)
    assert action == "skip" and "NOT_RESPONDING" in why and "does not answer" in why


def test_baseline_drains_are_not_counted_as_out_of_service():
    nodes = [
        node("IDLE+DRAIN", OURS, "a"),
        node("IDLE+DRAIN", "maintenance", "b"),
        node("DOWN+NOT_RESPONDING", "", "c"),
        node("IDLE", "", "d"),
    ]
    assert out_of_service(nodes) == ["b", "c"]


@pytest.fixture(scope="module")
def slurm_node01(tmp_path_factory):
    with slurm_with_slurmd(tmp_path_factory.mktemp("slurmd"), "node01", "node[02-03]") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    top = tmp_path_factory.mktemp("lab")
    env = ansible_env(top, STETHOSCOPE_LAB_DIR=str(top / "lab"))
    subprocess.run(
        [
            sys.executable,
            str(TOP / "tools/lab.py"),
            "build",
            "--nodes",
            "3",
            "--inventory",
            str(top / "inv/hosts.yml"),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    return top


def baseline(lab: Path, tmp_path: Path, dsn: str, cluster, *extra: str) -> subprocess.CompletedProcess:
    env = ansible_env(tmp_path, dsn, STETHOSCOPE_LAB_DIR=str(lab / "lab"))
    settings = {
        "stethoscope_scheduler": "slurm",
        "stethoscope_slurm_environment": {"SLURM_CONF": str(cluster.conf)},
        "stethoscope_txn_id": TXN,
        "baseline_batch": 3,
        "baseline_capacity_retries": 0,
    }
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(lab / "inv/hosts.yml"),
            str(TOP / "playbooks/baseline.yml"),
            "-e",
            json.dumps(settings),
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def actions(dsn: str) -> set[tuple[str, str]]:
    with Store(dsn) as store:
        rows = store.query(
            f"SELECT action, target FROM {store.database}.actions FINAL WHERE txn_id = '{TXN}'"
        )
    return {(a, t) for a, t in rows}


def test_idle_node_is_drained_for_the_run_and_resumed_after_a_failed_suite(
    lab, tmp_path, tmp_dsn, slurm_node01
):
    cluster = slurm_node01
    cluster.undrain_all()
    proc = baseline(
        lab,
        tmp_path,
        tmp_dsn,
        cluster,
        "-e",
        json.dumps({"baseline_suites": ["compute"], "bench_compute_inject_error_device": 0}),
    )
    out = proc.stdout
    assert "GEMM result differs from the reference" in out  # the suite failed on node01 ...
    assert "DRAIN" not in cluster.node("node01")["state"]  # ... and always resumed it
    assert "baseline preflight node01: run: drained for this baseline" in out
    assert LOCKED in out
    assert "baseline preflight node02: skipped: Slurm shows node02" in out
    assert "DRAIN" not in cluster.node("node02")["state"]  # never drained: it could not be checked
    assert actions(tmp_dsn) >= {
        ("baseline:drain", "node01"),
        ("baseline:resume", "node01"),
        ("baseline:skip", "node02"),
        ("baseline:skip", "node03"),
    }


def test_a_node_with_a_running_job_is_resumed_at_once_and_skipped(lab, tmp_path, tmp_dsn, slurm_node01):
    cluster = slurm_node01
    cluster.undrain_all()
    job = cluster.sbatch("node01", "sleep 300")
    try:
        cluster.wait_state("node01", "ALLOCATED")
        proc = baseline(lab, tmp_path, tmp_dsn, cluster, "-e", json.dumps({"baseline_suites": []}))
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert (
            "baseline preflight node01: skipped: a job is still running on node01 (DRAINING)" in proc.stdout
        )
        state = cluster.node("node01")["state"]  # resumed, its job untouched (+NOT_RESPONDING under load)
        assert state.split("+")[0] == "ALLOCATED" and "DRAIN" not in state
        assert LOCKED not in proc.stdout  # no node ran: node02/03 never respond
    finally:
        subprocess.run(["scancel", job], env={"SLURM_CONF": str(cluster.conf)}, check=False)
        cluster.wait_state("node01", "IDLE")


def test_a_remediation_drain_is_measured_and_left_for_verify(lab, tmp_path, tmp_dsn, slurm_node01):
    cluster = slurm_node01
    cluster.undrain_all()
    remediation = "stethoscope: gpu_silent_data_corruption 9f8e7d6c"
    cluster.scontrol("update", "NodeName=node01", "State=DRAIN", f"Reason={remediation}")
    proc = baseline(lab, tmp_path, tmp_dsn, cluster, "-e", json.dumps({"baseline_suites": []}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "baseline preflight node01: run: drained for remediation" in proc.stdout
    after = cluster.node("node01")
    assert "DRAIN" in after["state"] and after["reason"].startswith(remediation)
    assert ("baseline:resume", "node01") not in actions(tmp_dsn)


def test_slurm_configured_and_unreachable_refuses(lab, tmp_path, tmp_dsn):
    class Gone:
        conf = tmp_path / "no-such-slurm.conf"

    proc = baseline(lab, tmp_path, tmp_dsn, Gone, "-e", json.dumps({"baseline_suites": []}))
    assert proc.returncode != 0 and "Slurm does not answer: refusing to start a batch" in proc.stdout
    assert LOCKED not in proc.stdout
