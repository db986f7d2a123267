"""A sweep costs one module run per host: collect.yml on a 3-node lab runs one task on each node (the
fingerprint inside health_facts), stores the rows the fingerprint and health_facts modules stored as
two tasks before, and runs no lab step on an inventory that is not the lab."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from stethoscope.remediation.rebaseline import fingerprint_before, fingerprints
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import REAL, TOP, ansible_env, fake_tools, run_module

BIN = Path(sys.executable).parent
NODES = ["node01", "node02", "node03"]
HOUR = 3600_000
# The sweep as two module runs per host (and the role's two checks), as collect.yml ran it before: the
# reference whose stored rows the one-module sweep must equal, and benchmarks/collect_vs_ping.py's.
TWO_TASKS = TOP / "benchmarks/collect_two_tasks.yml"


def lab(tmp_path: Path, name: str) -> tuple[dict[str, str], Path]:
    """A 3-node lab of its own (folder, database, inventory) -> (environment, inventory)."""
    home = tmp_path / name
    inventory = home / "inventory" / "hosts.yml"
    env = ansible_env(
        home, f"chdb://{home / 'db'}", STETHOSCOPE_LAB_DIR=str(home / "lab"), ANSIBLE_INVENTORY=str(inventory)
    )
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "3", "--inventory", str(inventory)],
        env=env,
        check=True,
        capture_output=True,
    )
    return env, inventory


def sweep(env: dict[str, str], playbook: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(BIN / "ansible-playbook"), str(playbook)], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def results_per_host(stdout: str) -> Counter[str]:
    """Task results the play reported on each host itself (a step delegated to localhost apart)."""
    return Counter(re.findall(r"^(?:ok|changed|fatal|failed|skipping): \[([^\]\s]+)\]", stdout, re.M))


def stored(env: dict[str, str]) -> tuple[list[tuple], list[tuple]]:
    """The metric rows (callback's own apart) and the facts rows, without their times and with the
    lab's folder (the facts name it) as LAB."""
    with Store(env["STETHOSCOPE_DSN"]) as store:
        metrics = store.query(
            "SELECT node_id, metric_name, device, toString(labels), value FROM stethoscope.metrics "
            "WHERE metric_name != 'ansible_host_unreachable' ORDER BY node_id, metric_name, device, "
            "toString(labels), value"
        )
        facts = store.query(
            "SELECT node_id, collector, facts FROM stethoscope.facts ORDER BY node_id, collector"
        )
    lab_dir = env["STETHOSCOPE_LAB_DIR"]
    return metrics, [(node, kind, json.loads(text.replace(lab_dir, "LAB"))) for node, kind, text in facts]


def test_collect_runs_one_module_per_host_per_sweep(tmp_path):
    env, _inventory = lab(tmp_path, "one")
    for _sweep in range(2):
        proc = sweep(env, TOP / "playbooks/collect.yml")
        # the checks of every host's variables ran once, delegated to the controller: no host's result
        assert results_per_host(proc.stdout) == {node: 1 for node in NODES}, proc.stdout
        assert "health_collect : Check every host's health_collect variables" in proc.stdout
    assert (tmp_path / "one/lab/step").read_text().strip() == "2"  # the lab advanced once a sweep
    with Store(env["STETHOSCOPE_DSN"]) as store:
        changes = store.query(
            "SELECT node_id, count() FROM stethoscope.metrics WHERE metric_name = "
            "'node_fingerprint_changes_total' GROUP BY node_id ORDER BY node_id"
        )
    assert changes == [(node, 2) for node in NODES]  # the fingerprint once per node per sweep


def test_one_module_stores_the_rows_two_modules_stored(tmp_path):
    one_env, _ = lab(tmp_path, "one")
    two_env, _ = lab(tmp_path, "two")
    sweep(one_env, TOP / "playbooks/collect.yml")
    sweep(two_env, TWO_TASKS)
    one_metrics, one_facts = stored(one_env)
    two_metrics, two_facts = stored(two_env)
    assert one_metrics == two_metrics and len(one_metrics) > 100 * len(NODES)
    assert one_facts == two_facts
    assert {collector for _node, collector, _fact in one_facts} >= {"fingerprint", "gpu", "rdma"}


def test_no_lab_step_on_an_inventory_that_is_not_the_lab(tmp_path):
    """An inventory without the lab's group: the lab play matches no host, so no task runs for it."""
    env, inventory = lab(tmp_path, "one")
    text = inventory.read_text()
    inventory.write_text(re.sub(r"^ *stethoscope_lab:.*\n", "", text, flags=re.M))
    proc = sweep(env, TOP / "playbooks/collect.yml")
    assert "TASK [Advance the lab replay" not in proc.stdout and "skipping: no hosts matched" in proc.stdout
    assert results_per_host(proc.stdout) == {node: 1 for node in NODES}
    assert (tmp_path / "one/lab/step").read_text().strip() == "0"


def failed_sweep(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [str(BIN / "ansible-playbook"), str(TOP / "playbooks/collect.yml")]
    return subprocess.run(command, env=env, capture_output=True, text=True, check=False)


def test_one_host_with_no_collectors_fails_the_checks_before_any_module_runs(tmp_path):
    """The role's preflight, run once for every host's variables: node03's empty collectors list is
    named, and no host runs the module with variables unchecked."""
    env, inventory = lab(tmp_path, "one")
    text = inventory.read_text().replace("node03: {", "node03: {health_collect_collectors: [], ")
    inventory.write_text(text)
    proc = failed_sweep(env)
    assert proc.returncode != 0 and "node03: health_collect_collectors is empty" in proc.stdout, proc.stdout
    assert "Sweep health facts" not in proc.stdout


def test_one_host_with_a_variable_of_the_wrong_type_fails_the_checks_naming_it(tmp_path):
    """The argument spec, checked for every host's variables before any module runs: node03's bad
    timeout and unknown collector are named with the host."""
    env, inventory = lab(tmp_path, "one")
    bad = "health_collect_timeout: soon, health_collect_collectors: [gpu, bogus], "
    inventory.write_text(inventory.read_text().replace("node03: {", "node03: {" + bad))
    proc = failed_sweep(env)
    assert proc.returncode != 0, proc.stdout
    # each error names the host, whether as the loop's item or as the option it was found in
    for error in ("'health_collect_timeout' is of type str", "Got no match for: bogus"):
        assert re.search(rf"node03[^\n]*{error}|{error}[^\n]*node03", proc.stdout), proc.stdout
    assert "Sweep health facts" not in proc.stdout


def h200_tools(tmp_path: Path, gpu_query: str) -> Path:
    bindir = tmp_path / "bin"
    fake_tools(
        bindir,
        tmp_path / "argv.log",
        {
            "nvidia-smi": {
                "-q -x": gpu_query,
                "dmon -c 1 -s pucvmet": "real/h200-vm/commands/nvidia-smi_dmon_-c5_-s_pucvmet.txt",
                "nvlink -s": "real/h200-vm/commands/nvidia-smi_nvlink_--status.txt",
            },
            "dmesg": "real/h200-vm/commands/dmesg_nvrm_lines.txt",
        },
    )
    return bindir


def test_health_facts_fingerprints_as_the_fingerprint_module_does_and_saves_nothing_in_check_mode(tmp_path):
    bindir = h200_tools(tmp_path, "real/h200-vm/commands/nvidia-smi_-q_-x.xml")
    root, state = tmp_path / "root", tmp_path / "state"
    shutil.copytree(REAL / "root", root)
    args = {"root": str(root), "state_dir": str(state)}
    alone = run_module(tmp_path, "fingerprint", {**args, "count_changes": True}, bindir, check=True)
    checked = run_module(tmp_path, "health_facts", {**args, "fingerprint": True}, bindir, check=True)
    assert not state.exists()  # check mode: no fingerprint state, no collector state
    facts = checked["ansible_facts"]
    assert facts["stethoscope_fingerprint"] == alone["ansible_facts"]["stethoscope_fingerprint"]
    assert facts["stethoscope_fingerprint"]["present"] is True  # as every collector's fact says
    assert checked["stethoscope_metrics"][0] == alone["stethoscope_metrics"][0]
    assert checked["stethoscope_metrics"][0]["name"] == "node_fingerprint_changes_total"
    assert checked["fingerprint_change"] is None and "stethoscope_gpu" in facts
    (tmp_path / "argv.log").write_text("")
    swept = run_module(tmp_path, "health_facts", {**args, "fingerprint": True}, bindir)
    assert (state / "fingerprint.json").is_file() and swept["changed"] is False
    # the fingerprint and the GPU collector read one snapshot: nvidia-smi -q -x runs once a sweep
    assert (tmp_path / "argv.log").read_text().splitlines().count("nvidia-smi -q -x") == 1
    without = run_module(tmp_path, "health_facts", args, bindir)
    assert "stethoscope_fingerprint" not in without["ansible_facts"] and "fingerprint_change" not in without


def test_a_fingerprint_that_fails_is_a_failed_collector_and_the_others_still_run(tmp_path):
    bindir = h200_tools(tmp_path, "echo '<nvidia_smi_log><gpu'")
    args = {"root": str(REAL / "root"), "state_dir": str(tmp_path / "s"), "fingerprint": True}
    result = run_module(tmp_path, "health_facts", args, bindir)
    assert result["failed"] is True and result["failed_collectors"][0] == "fingerprint"
    assert result["ansible_facts"]["stethoscope_fingerprint"]["failures"][0]["tool"] == "nvidia-smi"
    assert "stethoscope_tuning" in result["ansible_facts"]
    failed = [row for row in result["stethoscope_metrics"] if row["name"] == "collector_failed"]
    assert {"collector": "fingerprint", "tool": "nvidia-smi"}.items() <= failed[0]["labels"].items()


def test_a_failed_fingerprint_row_does_not_hide_the_last_fingerprint(store):
    """A sweep whose fingerprint failed stores a `fingerprint` facts row without node_fingerprint (the
    failure's): the re-baseline planning still reads the node's last fingerprint, not ''."""
    now = now_ms()
    swept = {"node_fingerprint": "fp-node01", "class_fingerprint": "c", "detail": {"env_lock": {}}}
    failed = {"present": None, "failures": [{"tool": "nvidia-smi", "msg": "nvidia-smi: unreadable XML"}]}
    store.insert_rows(
        "facts",
        [{"node_id": "node01", "collector": "fingerprint", "run_id": run, "collected_at": at,
          "facts": json.dumps(fact)}
         for run, at, fact in [("r1", now - 2 * HOUR, swept), ("r2", now - HOUR, failed)]],
    )  # fmt: skip
    assert fingerprints(store, ["node01"])["node01"].node_fingerprint == "fp-node01"
    assert fingerprint_before(store, "node01", now) == "fp-node01"
