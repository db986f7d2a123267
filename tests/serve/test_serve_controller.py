"""`serve` is the one long-running controller: it runs the sweeps itself (collect.yml through real
ansible-runner, at the inventory's cadence, never overlapping), stores them while it holds the
embedded database (through the spool it replays), says on /metrics what it found per node and how
long its cycles and sweeps took, logs one line per cycle, and an address already in use is exit 2."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from stethoscope.priority import BACKGROUND_NICENESS
from stethoscope.serve.sweeps import Sweeper
from stethoscope.store.client import Store

from conftest import LAB_INVENTORY, TOP, ansible_env

SECRET = b"serve-controller-secret-0123456789"
PORT_DOWN = 'stethoscope_findings_open{node="node08",rule_id="ib_port_not_active",severity="critical"} 1.0'


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def test_serve_sweeps_the_lab_itself_stores_every_sweep_and_says_so_on_metrics(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    env = ansible_env(tmp_path, dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"))
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build"], env=env, check=True, capture_output=True
    )
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(LAB_INVENTORY), "--secret-file", str(secret), "--no-model",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "5", "--sweep-interval", "25",
        "--log-format", "json",
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=TOP
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz, sweeps every 25 s", head)
        assert match, head + (proc.stderr.read() if proc.poll() is not None else "")
        http = match[1]
        threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
        deadline = time.time() + 240
        metrics = ""
        while time.time() < deadline:
            health = json.loads(_get(f"{http}/healthz"))
            metrics = _get(f"{http}/metrics")
            if health["sweeps"]["ok"] >= 2 and PORT_DOWN in metrics:
                break
            time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert health["sweeps"]["ok"] >= 2 and health["sweeps"]["failed"] == 0, health
    assert health["sweeps"]["last_hosts"] == {"ok": 8, "failed": 0, "unreachable": 0}
    assert PORT_DOWN in metrics
    assert re.search(r'stethoscope_incidents_open\{node="node08",severity="critical"\} \d', metrics)
    assert 'stethoscope_sweeps_total{outcome="ok"}' in metrics
    assert re.search(r"stethoscope_cycle_duration_seconds_count \d", metrics)
    assert re.search(r"stethoscope_sweep_duration_seconds_count [1-9]", metrics)
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and all(r["event"] == "cycle" and "seconds" in r for r in records)
    with Store(dsn) as store:  # every sweep stored: written through the spool serve replays
        swept = store.query(
            f"SELECT uniqExact(timestamp) FROM {store.database}.metrics "
            "WHERE node_id = 'node08' AND metric_name = 'ib_port_state'"
        )[0][0]
    assert swept >= health["sweeps"]["ok"]


def test_a_sweep_still_running_at_the_next_interval_is_not_overlapped(tmp_path):
    slow = tmp_path / "slow.yml"
    slow.write_text(
        "---\n- name: A sweep that takes 3 s\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Wait\n      ansible.builtin.pause:\n        seconds: 3\n"
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("---\nall:\n  hosts:\n    node01: {ansible_connection: local}\n")
    sweeper = Sweeper(inventory, 1.0, {}, playbook=str(slow))
    spans: list[tuple[float, float]] = []  # each sweep's (start, end), as it ended
    sweeper.on_done = lambda seconds: spans.append((time.monotonic() - seconds, time.monotonic()))
    sweeper.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (len(spans) < 2 or sweeper.stats.skipped < 2):
        time.sleep(0.2)
    sweeper.stop()
    while sweeper.stats.running and time.monotonic() < deadline + 30:  # the one under way ends
        time.sleep(0.2)
    stats = sweeper.stats
    assert stats.ok >= 2 and stats.failed == 0 and stats.skipped >= 2, stats
    ordered = sorted(spans)
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(ordered))
    assert all(end - start >= 3 for start, end in spans)


def test_a_failed_sweep_is_logged_naming_its_failed_hosts(tmp_path, caplog):
    """A sweep whose hosts failed is a symptom: serve's log says so at once, naming the hosts and
    what they failed with (its /healthz keeps only the last error, and a later good sweep clears it)."""
    failing = tmp_path / "failing.yml"
    failing.write_text(
        "---\n- name: A sweep that fails on one host\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Fail on node02\n      ansible.builtin.fail:\n        msg: nvidia-smi exited 255\n"
        "      when: inventory_hostname == 'node02'\n"
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "---\nall:\n  hosts:\n    node01: {ansible_connection: local}\n"
        "    node02: {ansible_connection: local}\n"
    )
    sweeper = Sweeper(inventory, 3600.0, {}, playbook=str(failing))
    with caplog.at_level("WARNING", logger="stethoscope.serve.sweeps"):
        sweeper.start()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not (sweeper.stats.ok or sweeper.stats.failed):
            time.sleep(0.2)
        sweeper.stop()
    assert sweeper.stats.failed == 1 and sweeper.stats.last_hosts["failed"] == 1, sweeper.stats
    said = [record.getMessage() for record in caplog.records if record.getMessage().startswith("sweep:")]
    assert len(said) == 1, said
    assert "node02" in said[0] and "nvidia-smi exited 255" in said[0] and "node01" not in said[0], said


def test_a_host_failing_after_hundreds_of_ok_events_is_named_with_its_reason(tmp_path):
    """On a large sweep the first events kept are ok ones: a failure past them still says why."""
    from stethoscope.remediation.actions.playbook import MAX_EVENTS, run_playbook
    from stethoscope.serve.sweeps import failed_hosts

    tasks = "".join(
        f"    - name: Step {n}\n      ansible.builtin.set_fact:\n        step: {n}\n"
        for n in range(MAX_EVENTS)
    )
    playbook = tmp_path / "long.yml"
    playbook.write_text(
        "---\n- name: Many ok events, then one failure\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        + tasks
        + "    - name: Fail on node02\n      ansible.builtin.fail:\n        msg: ibstat printed nothing\n"
        "      when: inventory_hostname == 'node02'\n"
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "---\nall:\n  hosts:\n    node01: {ansible_connection: local}\n"
        "    node02: {ansible_connection: local}\n"
    )
    result = run_playbook(str(playbook), inventory, None, {}, {}, 300)
    assert not result.ok
    said = failed_hosts([result], {"node01": "ok", "node02": "failures"})
    assert said == "node02 (Fail on node02: ibstat printed nothing)", said


def test_a_sweep_runs_below_the_operators_commands_in_cpu_priority(tmp_path):
    """On a loaded controller the operator's commands beside serve come first: the sweep's
    ansible-playbook and the modules it starts run at a niceness of at least BACKGROUND_NICENESS.
    Where the kernel shares CPU time between sessions first (autogroup, on by default in Debian's
    kernels), a niceness weighs only inside its session: the playbook's own session (ansible-runner
    starts it on a terminal of its own) is lowered too, serve's is not."""
    if os.nice(0) >= BACKGROUND_NICENESS:
        pytest.skip(f"the tests run at niceness {os.nice(0)}: a sweep at {BACKGROUND_NICENESS} shows nothing")
    probe = tmp_path / "niceness.yml"
    out = tmp_path / "niceness"
    probe.write_text(
        "---\n- name: Record the sweep's niceness\n  hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - name: Read it\n      ansible.builtin.command: sh -c 'nice; cat /proc/self/autogroup || true'\n"
        "      register: niceness\n"
        "      changed_when: false\n"
        '    - name: Keep it\n      ansible.builtin.copy:\n        content: "{{ niceness.stdout }}"\n'
        f"        dest: {out}\n        mode: '0600'\n"
    )
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "---\nall:\n  hosts:\n    node01:\n      ansible_connection: local\n"
        "      ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
    )
    own_group = Path("/proc/self/autogroup")
    before = own_group.read_text() if own_group.exists() else ""
    sweeper = Sweeper(inventory, 3600.0, {}, playbook=str(probe))
    sweeper.start()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and not (sweeper.stats.ok or sweeper.stats.failed):
        time.sleep(0.2)
    sweeper.stop()
    assert sweeper.stats.ok == 1, sweeper.stats
    niceness, _, group = out.read_text().partition("\n")
    assert int(niceness) >= BACKGROUND_NICENESS > 0
    if before:  # a kernel built without autogroup groups nothing
        assert int(group.split()[-1]) >= BACKGROUND_NICENESS, group
        assert own_group.read_text() == before  # serve's session (here the test's) is untouched


def test_an_http_address_in_use_is_a_configuration_error_that_names_it(tmp_path):
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("---\nall:\n  hosts:\n    gpu-a: {stethoscope_node_key: 1}\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "stethoscope.cli",
                "--dsn",
                f"chdb://{tmp_path / 'db'}",
                "serve",
                "--inventory",
                str(inventory),
                "--secret-file",
                str(secret),
                "--no-sweep",
                "--listen",
                "127.0.0.1:0",
                "--http",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            cwd=TOP,
            timeout=120,
        )
    finally:
        busy.close()
    assert run.returncode == 2, run.stderr
    assert f"--http 127.0.0.1:{port}: cannot listen there: Address already in use" in run.stderr
    assert "Traceback" not in run.stderr and not Path(tmp_path / "db").exists()


def test_serve_of_a_cluster_whose_nodes_do_not_stream_runs_its_sweeps_and_diagnosis(tmp_path):
    """Regression guard (a fresh-clone trial): serve refused an inventory with no stethoscope_node_key,
    so a cluster that is only swept (inventories/example) could not run it at all."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("---\nall:\n  hosts:\n    gpu-a: {ansible_connection: local}\n")
    run = subprocess.run(
        [
            *[sys.executable, "-m", "stethoscope.cli", "--dsn", f"chdb://{tmp_path / 'db'}"],
            *["serve", "--inventory", str(inventory), "--no-sweep", "--no-model", "--cycles", "1"],
            *["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "1"],
        ],
        capture_output=True,
        text=True,
        cwd=TOP,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert "the 5-second stream is off" in run.stderr and "serve stopped" in run.stdout
    assert "serve: cycle 1 at" in run.stdout  # the diagnosis ran: UNKNOWN for gpu-a, which said nothing
