"""`serve` is the one long-running controller: it runs the sweeps itself (collect.yml through real
ansible-runner, at the inventory's cadence, never overlapping), stores them while it holds the
embedded database (through the spool it replays), says on /metrics what it found per node and how
long its cycles and sweeps took, logs one line per cycle, and an address already in use is exit 2."""

from __future__ import annotations

import json
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

from stethoscope.serve.sweeps import Sweeper
from stethoscope.store.client import Store

from conftest import LAB_INVENTORY, TOP, ansible_env

SECRET = b"serve-controller-secret-0123456789"
PORT_DOWN = 'stethoscope_findings_open{node="node08",rule_id="ib_port_not_active",severity="critical"} 1.0'


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


@pytest.mark.slow
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
    running_at_once = []
    sweeper.on_done = lambda seconds: running_at_once.append(sweeper._busy.locked())
    sweeper.start()
    time.sleep(8)
    sweeper.stop(wait=10)
    stats = sweeper.stats
    assert stats.ok >= 1 and stats.skipped >= 2, stats
    assert stats.ok + stats.failed <= 3  # 8 s of 3-second sweeps, one at a time
    assert all(seconds >= 3 for seconds in stats.durations)


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
