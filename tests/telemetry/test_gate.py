"""The Slurm gate: serve publishes each node's verdict signed with the node's own
key; the gate, as the node runs it (the copied gate.py, the controller's dependencies blocked), exits 1
with a reason when the node has an open critical finding or its data stopped, 0 when clear, keeps the
last good verdict for when serve is down, refuses a verdict it cannot verify, that is another node's or
that is ahead of its clock; the slurm_gate role installs it as HealthCheckProgram and a real slurmd
drains the node. The safety rules: a dry-run serve's failures drain nothing, serve fails no more nodes
than the circuit breaker has room for, no fresh verdict is said and never drained for, and a clear
node's gate calls no scontrol."""

from __future__ import annotations

import ast
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from stethoscope.telemetry import gate, wire

from conftest import TOP, ansible_env, hot_gpu

GATE = TOP / "stethoscope" / "telemetry" / "gate.py"
SECRET = b"gate-test-cluster-secret-0123456789"
KEY = wire.node_secret(SECRET, "node01")
HOT_RULE = """
- rule_id: gpu_too_hot
  description: hot GPU (test)
  severity: critical
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 80, window: 5m}
"""
INVENTORY = """
all:
  hosts:
    node01: {stethoscope_node_key: 1, slurm_name: node01}
    node02: {stethoscope_node_key: 2, slurm_name: node02}
    node03: {slurm_name: node03}
    node04: {stethoscope_node_key: 4, slurm_name: node04}
"""
# a stand-in scontrol on the node: it says nothing and notes each call
STANDIN_SCONTROL = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'


def test_the_gate_parses_as_python_3_8() -> None:
    ast.parse(GATE.read_text(), filename="gate.py", feature_version=(3, 8))


def test_a_signed_verdict_verifies_and_a_forged_or_foreign_one_is_refused() -> None:
    verdict = gate.verdict_of("node01", [], 1000.0, 60.0)
    body = gate.sign([KEY], verdict)
    assert gate.verify(KEY, body, "node01") == verdict
    previous = wire.node_secret(b"the-secret-before-the-rotation", "node01")
    assert gate.verify(previous, gate.sign([KEY, previous], verdict), "node01") == verdict  # rotation
    outer = json.loads(body)
    tampered = json.dumps({**outer, "payload": outer["payload"].replace('"ok"', '"fail"')}).encode()
    for forged, node, why in (
        (tampered, "node01", "MAC does not verify"),
        (gate.sign([wire.node_secret(SECRET, "node02")], verdict), "node01", "MAC does not verify"),
        (gate.sign([KEY], gate.verdict_of("node02", [], 1000.0, 60.0)), "node01", "not 'node01'"),
        (b"<html>a proxy's page</html>", "node01", "unreadable"),
    ):
        with pytest.raises(gate.VerdictError, match=why):
            gate.verify(KEY, forged, node)


def test_the_verdict_fails_on_an_open_critical_finding_of_the_node_only() -> None:
    def finding(node, severity, rule="gpu_xid_79", txn="t1", **extra):
        return {"node_id": node, "severity": severity, "rule_id": rule, "txn_id": txn, **extra}

    found = [
        finding("node01", "critical"),
        finding("node01", "warning", rule="nvme_wear", txn=""),
        finding("node02", "critical", rule="ib_port_down", txn="t2"),
        finding("node03", "critical", silenced=True),
        finding("node04", "warning"),
    ]
    one = gate.verdict_of("node01", found, 1000.0, 63.0)
    assert one["verdict"] == "fail" and one["reasons"] == ["gpu_xid_79 t1"]
    assert one["findings"] == [
        {"rule": "gpu_xid_79", "txn": "t1", "severity": "critical"},
        {"rule": "nvme_wear", "txn": "", "severity": "warning"},
    ]
    assert (one["at"], one["expires"]) == (1000.0, 1063.0)
    assert gate.verdict_of("node03", found, 1000.0, 63.0)["verdict"] == "ok"  # silenced: no gate
    assert gate.verdict_of("node04", found, 1000.0, 63.0)["verdict"] == "ok"  # a warning only
    assert gate.verdict_of("node05", found, 1000.0, 63.0)["reasons"] == []


def test_a_node_whose_data_stopped_fails_but_a_fleet_outage_fails_no_node() -> None:
    def finding(node, rule, severity="unknown"):
        return {"node_id": node, "severity": severity, "rule_id": rule, "txn_id": "t"}

    found = [
        finding("node01", "unknown.node"),
        finding("node02", "unknown.unreachable", "warning"),
        finding("node03", "unknown.fleet", "unknown"),
        finding("node04", "some.unknown_rule"),
    ]
    assert gate.verdict_of("node01", found, 1000.0, 63.0)["reasons"] == ["unknown.node t"]
    assert gate.verdict_of("node02", found, 1000.0, 63.0)["verdict"] == "fail"
    assert gate.verdict_of("node03", found, 1000.0, 63.0)["verdict"] == "ok"  # the pipeline's, not node03's
    assert gate.verdict_of("node04", found, 1000.0, 63.0)["verdict"] == "ok"


def test_a_verdict_made_ahead_of_the_nodes_clock_is_refused() -> None:
    now = time.time()
    ahead = gate.sign([KEY], gate.verdict_of("node01", [], now + 3600, 60.0))
    with pytest.raises(gate.VerdictError, match="ahead of this node's clock"):
        gate.verify(KEY, ahead, "node01")
    slightly = gate.verdict_of("node01", [], now + 30, 60.0)  # within the tolerance: clocks differ a little
    assert gate.verify(KEY, gate.sign([KEY], slightly), "node01") == slightly


def test_a_verdict_counts_until_it_expires_or_its_grace_and_none_fails() -> None:
    clear = gate.verdict_of("node01", [], 1000.0, 63.0)
    assert gate.judge(clear, 1063.0, None, "cached").ok
    late = gate.judge(clear, 1063.5, None, "cached")
    assert not late.ok and late.reason == "stethoscope gate: no fresh verdict (last at 1970-01-01T00:16:40Z)"
    assert late.unverified  # said, never drained for
    assert not gate.judge(clear, 1010.0, 5.0, "cached").ok  # the node's own grace, shorter than serve's
    assert gate.judge(None, 1000.0, None, "serve").reason.startswith(gate.STALE_PREFIX)
    failing = gate.verdict_of(
        "node01", [{"node_id": "node01", "severity": "critical", "rule_id": "r"}], 1e3, 9
    )
    assert gate.judge(failing, 1001.0, None, "serve").reason == "stethoscope gate: r"


# the gate against a real serve ----------------------------------------------------------------
def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class Served:
    """serve as a real subprocess; `execute`: with --execute (its verdicts drain), else a dry-run."""

    def __init__(self, top: Path, execute: bool = True):
        self.top = top
        dsn = f"chdb://{top / 'db'}"
        hot_gpu(dsn, "node01")  # node01's gpu0 at 85 C: critical under the test's rule
        hot_gpu(dsn, "node04")  # node04's too: the circuit breaker (1 of 4 nodes) has room for one
        (top / "rules").mkdir()
        (top / "rules/hot.yml").write_text(textwrap.dedent(HOT_RULE))
        (top / "hosts.yml").write_text(INVENTORY)
        (top / "cluster.secret").write_bytes(SECRET + b"\n")
        command = [
            sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(top / "spool"),
            "serve", "--inventory", str(top / "hosts.yml"), "--secret-file", str(top / "cluster.secret"),
            "--rules", str(top / "rules"), "--no-model", "--no-sweep", "--listen", "127.0.0.1:0",
            "--http", "127.0.0.1:0", "--gate-listen", "127.0.0.1:0", "--interval", "1",
        ] + (["--execute"] if execute else [])  # fmt: skip
        errors = top / "serve.stderr"
        with errors.open("w") as sink:  # a file: a pipe nobody reads could fill and stop serve
            self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sink, text=True, cwd=TOP)
        assert self.proc.stdout is not None
        head = self.proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz, gate (http://[\d.]+:\d+)/gate/NODE", head)
        assert match, head + errors.read_text()
        self.url, self.gate_url = match[1], match[2]
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # its cycle lines, drained
        deadline = time.monotonic() + 60
        while _get(f"{self.url}/gate/node01") != 200 and time.monotonic() < deadline:
            time.sleep(0.2)  # the first cycle publishes the verdicts
        assert _get(f"{self.url}/gate/node01") == 200, "serve published no verdict in 60 s"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = Served(tmp_path_factory.mktemp("serve"))
    yield running
    running.stop()


def _node(tmp_path: Path, served: Served, node: str, key: bytes | None = None, **config) -> Path:
    """The gate as the role leaves it on `node`: gate.py copied, its config, its key (hex), serve's
    gate address."""
    home = tmp_path / node
    home.mkdir(exist_ok=True)
    shutil.copy(GATE, home / "gate.py")
    (home / "gate.key").write_text((key or wire.node_secret(SECRET, node)).hex() + "\n")
    settings = {
        "serve": served.gate_url,
        "node_id": node,
        "key_file": str(home / "gate.key"),
        "state_dir": str(home / "state"),
        "drain": False,
        **config,
    }
    (home / "gate.json").write_text(json.dumps(settings))
    return home


def _run_on_node(home: Path, *argv: str) -> subprocess.CompletedProcess:
    """gate.py run as a node runs it: its own file, chdb, clickhouse_connect, yaml and stethoscope blocked."""
    blocker = textwrap.dedent(f"""
        import importlib.abc, runpy, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("chdb", "clickhouse_connect", "yaml", "stethoscope"):
                    raise ImportError("blocked on a node: " + name)
        sys.meta_path.insert(0, Block())
        sys.argv = ["gate.py", "--config", {str(home / "gate.json")!r}, *{list(argv)!r}]
        runpy.run_path({str(home / "gate.py")!r}, run_name="__main__")
    """)
    return subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=30)


def test_the_gate_fails_a_node_with_a_critical_finding_and_passes_a_clear_one(tmp_path, served):
    hot = _run_on_node(_node(tmp_path, served, "node01"))
    assert hot.returncode == 1, hot.stderr
    assert hot.stderr.startswith("stethoscope gate: node01: FAIL: stethoscope gate: gpu_too_hot"), hot.stderr
    clear_home = _node(tmp_path, served, "node02")
    clear = _run_on_node(clear_home)
    assert clear.returncode == 0, clear.stderr
    assert "stethoscope gate: node02: ok (verdict at " in clear.stdout and "from serve" in clear.stdout
    cache = clear_home / "state" / gate.CACHE_NAME
    assert cache.stat().st_mode & 0o777 == 0o600
    assert json.loads(json.loads(cache.read_bytes())["payload"])["node"] == "node02"
    # the controller's `stethoscope gate` is the same code; it answers while serve holds the database
    cli = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "gate", "--config", str(clear_home / "gate.json")],
        capture_output=True, text=True, cwd=TOP, timeout=60,
    )  # fmt: skip
    assert cli.returncode == 0 and "node02: ok" in cli.stdout, cli.stderr


def _standin_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """(the stand-in scontrol, the file of its calls)."""
    folder = tmp_path / "standin"
    folder.mkdir(exist_ok=True)
    program = folder / "scontrol"
    program.write_text(STANDIN_SCONTROL)
    program.chmod(0o755)
    return program, folder / "calls"


def test_a_verdict_the_node_cannot_verify_or_an_unkeyed_node_counts_as_none(tmp_path, served):
    scontrol, calls = _standin_scontrol(tmp_path)
    forged_home = _node(
        tmp_path,
        served,
        "node02",
        key=wire.node_secret(b"another-secret-0123", "node02"),
        drain=True,
        scontrol=str(scontrol),
    )
    forged = _run_on_node(forged_home)
    assert forged.returncode == 0  # no verdict is serve's symptom: said, not failed on by default
    assert (
        "its MAC does not verify" in forged.stderr and "no fresh verdict (none from serve)" in forged.stderr
    )
    assert _run_on_node(forged_home, "--fail-when-unverified").returncode == 1
    assert not calls.exists()  # never drained for
    assert not (tmp_path / "node02/state" / gate.CACHE_NAME).exists()  # never kept
    unkeyed = _run_on_node(_node(tmp_path, served, "node03"), "--fail-when-unverified")
    assert unkeyed.returncode == 1 and "answered 404: no verdict for node03" in unkeyed.stderr, unkeyed.stderr
    bad = _run_on_node(_node(tmp_path, served, "node02", key_file=str(tmp_path / "missing.key")))
    assert bad.returncode == 2 and "missing.key" in bad.stderr and "Traceback" not in bad.stderr


def test_the_gate_address_answers_the_verdicts_and_nothing_else(served):
    assert _get(f"{served.gate_url}/gate/node01") == 200
    for path in ("/metrics", "/report", "/healthz", "/report/nodes/node01.html"):
        assert _get(served.gate_url + path) == 404, path
    assert _get(f"{served.url}/metrics") == 200  # the loopback endpoint keeps them


def test_serve_fails_no_more_nodes_than_the_circuit_breaker_has_room_for(tmp_path, served):
    first = _run_on_node(_node(tmp_path, served, "node01"))
    assert first.returncode == 1 and "FAIL: stethoscope gate: gpu_too_hot" in first.stderr, first.stderr
    held = _run_on_node(_node(tmp_path, served, "node04"))  # as hot, past the breaker's room
    assert held.returncode == 0, held.stderr
    assert "held back by the circuit breaker" in held.stdout and "gpu_too_hot" in held.stdout, held.stdout


def test_a_clear_nodes_gate_calls_no_scontrol(tmp_path, served):
    scontrol, calls = _standin_scontrol(tmp_path)
    clear = _run_on_node(_node(tmp_path, served, "node02", drain=True, scontrol=str(scontrol)))
    assert clear.returncode == 0, clear.stderr
    assert not calls.exists()
    hot = _run_on_node(_node(tmp_path, served, "node01", drain=True, scontrol=str(scontrol)))
    assert hot.returncode == 1 and "state=drain" in calls.read_text()  # the stand-in does act


def test_a_fresh_verdict_from_serve_wins_over_a_cached_one_made_later(tmp_path, served):
    home = _node(tmp_path, served, "node01")
    (home / "state").mkdir()
    later_clear = gate.verdict_of("node01", [], time.time() + 30, 3600.0)  # a clock a little ahead
    (home / "state" / gate.CACHE_NAME).write_bytes(gate.sign([KEY], later_clear))
    hot = _run_on_node(home)
    assert hot.returncode == 1 and "gpu_too_hot" in hot.stderr, hot.stdout + hot.stderr


def test_a_dry_run_serves_failures_are_advisory(tmp_path, served):
    dry = Served(tmp_path / "dry", execute=False)
    try:
        scontrol, calls = _standin_scontrol(tmp_path)
        hot = _run_on_node(_node(tmp_path, dry, "node01", drain=True, scontrol=str(scontrol)))
        assert hot.returncode == 1 and "gpu_too_hot" in hot.stderr, hot.stderr
        assert "advisory: serve runs without --execute" in hot.stderr
        assert not calls.exists()  # nothing drained
    finally:
        dry.stop()


def test_the_role_refuses_an_https_serve_and_a_prolog_slurm_never_runs(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=lab\n")
    settings = {
        "slurm_gate_cluster_secret": SECRET.decode(),
        "slurm_gate_slurm_conf_file": str(conf),
        "slurm_gate_prolog_dir": str(tmp_path / "prolog.d"),
    }
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"node01": host}}}))
    (tmp_path / "gate.yml").write_text(
        "---\n- name: Install the gate\n  hosts: node01\n  gather_facts: false\n"
        "  roles:\n    - role: aicluster.stethoscope.slurm_gate\n"
    )

    def check(**extra: str) -> subprocess.CompletedProcess:
        command = [
            str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
            str(tmp_path / "gate.yml"), "--check", "--tags", "slurm_gate_preflight",
            "-e", json.dumps({**settings, **extra}),
        ]  # fmt: skip
        return subprocess.run(command, env=ansible_env(tmp_path), cwd=TOP, capture_output=True, text=True)

    https = check(slurm_gate_serve="https://10.0.0.1:9977", slurm_gate_mode="health_check")
    assert https.returncode != 0 and "slurm_gate_serve" in https.stdout, https.stdout[-3000:]
    prolog = check(slurm_gate_serve="http://10.0.0.1:9977", slurm_gate_mode="prolog")
    assert prolog.returncode != 0 and "Slurm would never run the gate" in prolog.stdout, prolog.stdout[-3000:]
    conf.write_text(f"ClusterName=lab\nProlog={tmp_path / 'prolog.d'}/*\n")
    ready = check(slurm_gate_serve="http://10.0.0.1:9977", slurm_gate_mode="prolog")
    assert ready.returncode == 0, ready.stdout[-3000:]


# the role and a real slurmd --------------------------------------------------------------------
def test_the_role_installs_the_gate_as_health_check_and_slurmd_drains_the_failing_node(tmp_path, served):
    from slurm_lab import WITH_SLURMD, SlurmCluster, missing_tools

    missing = missing_tools() + missing_tools(WITH_SLURMD)
    if missing:
        pytest.skip(f"Slurm with slurmd is not installed here ({', '.join(missing)}): .ci/run installs it")
    cluster = SlurmCluster(tmp_path / "slurm", nodes="node[02-03]", with_slurmd="node01").start()
    try:
        root = tmp_path / "root"
        user = pwd.getpwuid(os.getuid()).pw_name
        settings = {
            "slurm_gate_serve": served.url,
            "slurm_gate_cluster_secret": SECRET.decode(),
            "slurm_gate_python": sys.executable,
            "slurm_gate_install_dir": str(root / "opt/stethoscope-gate"),
            "slurm_gate_config_dir": str(root / "etc/stethoscope"),
            "slurm_gate_state_dir": str(root / "var/lib/stethoscope-gate"),
            "slurm_gate_program": str(root / "usr/local/sbin/stethoscope-gate"),
            "slurm_gate_owner": user,
            "slurm_gate_group": user,
            "slurm_gate_mode": "health_check",
            "slurm_gate_slurm_conf_file": str(cluster.conf),
            "slurm_gate_slurm_conf": str(cluster.conf),
            "slurm_gate_scontrol": shutil.which("scontrol") or "/usr/bin/scontrol",
        }
        host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"node01": host}}}))
        (tmp_path / "gate.yml").write_text(
            "---\n- name: Install the gate\n  hosts: node01\n  gather_facts: false\n"
            "  roles:\n    - role: aicluster.stethoscope.slurm_gate\n"
        )
        env = ansible_env(tmp_path)

        def converge(*extra: str) -> subprocess.CompletedProcess:
            command = [
                str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                str(tmp_path / "gate.yml"), "-e", json.dumps(settings), *extra,
            ]  # fmt: skip
            return subprocess.run(command, env=env, cwd=TOP, capture_output=True, text=True, timeout=300)

        checked = converge("--check")
        assert checked.returncode == 0, checked.stdout[-3000:]
        assert not (root / "etc/stethoscope/gate.json").exists()  # check mode writes nothing
        first = converge()
        assert first.returncode == 0, first.stdout[-3000:]
        again = converge()
        assert again.returncode == 0 and re.search(r"node01\s*: ok=\d+\s+changed=0 ", again.stdout), (
            again.stdout
        )
        assert (root / "etc/stethoscope/gate.key").stat().st_mode & 0o777 == 0o600
        assert f"HealthCheckProgram={settings['slurm_gate_program']}" in cluster.conf.read_text()

        cluster.start_slurmd("node01")  # slurmd runs its HealthCheckProgram as it starts
        deadline = time.monotonic() + 30
        while "DRAIN" not in cluster.node("node01")["state"] and time.monotonic() < deadline:
            time.sleep(0.3)
        node = cluster.node("node01")
        assert "DRAIN" in node["state"], node
        assert node["reason"].startswith("stethoscope gate: gpu_too_hot"), node
    finally:
        cluster.stop()


def test_as_the_prolog_the_gate_refuses_the_job_and_drains_the_node_with_its_reason(tmp_path, served):
    from slurm_lab import WITH_SLURMD, SlurmCluster, missing_tools

    missing = missing_tools() + missing_tools(WITH_SLURMD)
    if missing:
        pytest.skip(f"Slurm with slurmd is not installed here ({', '.join(missing)}): .ci/run installs it")
    cluster = SlurmCluster(tmp_path / "slurm", nodes="node[02-03]", with_slurmd="node01").start()
    try:
        settings = {"drain": True, "slurm_conf": str(cluster.conf), "scontrol": shutil.which("scontrol")}
        home = _node(tmp_path, served, "node01", **settings)
        prolog = tmp_path / "prolog.sh"  # what the role's prolog snippet does: exec the gate
        prolog.write_text(
            f"#!/bin/sh\nexec {sys.executable} {home / 'gate.py'} --config {home / 'gate.json'}\n"
        )
        prolog.chmod(0o755)
        with cluster.conf.open("a") as conf:
            conf.write(f"Prolog={prolog}\n")
        assert cluster.scontrol("reconfigure").returncode == 0
        cluster.start_slurmd("node01")
        job = cluster.sbatch("node01", "sleep 300")
        state = ""
        deadline = time.monotonic() + 60
        while "held" not in state and time.monotonic() < deadline:
            time.sleep(0.5)
            squeue = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T %r"], capture_output=True, text=True, env=cluster.env
            )
            state = squeue.stdout.strip()
        assert state.startswith("PENDING") and "launch failed requeued held" in state, state
        node = cluster.node("node01")
        assert "DRAIN" in node["state"] and node["reason"].startswith("stethoscope gate: gpu_too_hot"), node
    finally:
        subprocess.run(["scancel", "--user", pwd.getpwuid(os.getuid()).pw_name], env=cluster.env, check=False)
        cluster.stop()


def test_the_gate_keeps_a_persons_drain_and_never_lifts_one(tmp_path, served, slurm):
    slurm_settings = {"drain": True, "slurm_conf": str(slurm.conf), "scontrol": shutil.which("scontrol")}
    slurm.scontrol("update", "nodename=node01", "state=drain", "reason=person: reseating a DIMM")
    kept = _run_on_node(_node(tmp_path, served, "node01", **slurm_settings))
    assert kept.returncode == 1 and "already drained: person: reseating a DIMM" in kept.stderr, kept.stderr
    assert slurm.node("node01")["reason"].startswith("person: reseating a DIMM")
    slurm.scontrol("update", "nodename=node02", "state=drain", "reason=stethoscope: gpu_xid_79 t9")
    assert _run_on_node(_node(tmp_path, served, "node02", **slurm_settings)).returncode == 0
    assert "DRAIN" in slurm.node("node02")["state"]  # a finding's drain: verify's to lift


# serve stopped: the cache, then stale -------------------------------------------------------------
def test_with_serve_stopped_the_cached_verdict_counts_until_its_grace_then_is_said(tmp_path, served):
    scontrol, calls = _standin_scontrol(tmp_path)
    clear = _node(tmp_path, served, "node02", drain=True, scontrol=str(scontrol))
    hot = _node(tmp_path, served, "node01")
    assert _run_on_node(clear).returncode == 0 and _run_on_node(hot).returncode == 1  # cached, both
    served.stop()
    cached = _run_on_node(clear)
    assert cached.returncode == 0, cached.stderr
    assert (
        "(verdict at " in cached.stdout and ", cached)" in cached.stdout and "serve http://" in cached.stdout
    )
    assert _run_on_node(hot).returncode == 1  # a cached fail still fails
    time.sleep(0.3)  # older than the grace the next run gives
    stale = _run_on_node(clear, "--grace", "0.2")
    assert stale.returncode == 0  # serve's symptom, not the node's: said on stderr
    assert "FAIL: stethoscope gate: no fresh verdict (last at " in stale.stderr, stale.stderr
    assert _run_on_node(clear, "--grace", "0.2", "--fail-when-unverified").returncode == 1
    assert not calls.exists()  # never drained for


def test_the_gate_fails_no_more_nodes_than_the_tightest_breaker_limit_allows():
    from stethoscope.remediation.breaker import CircuitBreaker
    from stethoscope.serve.verdicts import capped, room_of

    failing = {f"node{i:02d}": {"verdict": gate.FAIL, "reasons": ["gpu_too_hot"]} for i in (1, 2, 9)}
    # 16 nodes: own limit 1 (none used); out of service limit 2, which one human drain leaves room in
    one_human = CircuitBreaker(16, others={"node09": "a person's drain"})
    verdicts = capped(failing, room_of(one_human))
    assert [n for n, v in verdicts.items() if v["verdict"] == gate.FAIL] == ["node01", "node09"]
    # two human drains fill the out-of-service limit: the own limit's spare one is not room
    two_humans = CircuitBreaker(16, others={"node09": "a person's drain", "node10": "down"})
    verdicts = capped(failing, room_of(two_humans))
    assert [n for n, v in verdicts.items() if v["verdict"] == gate.FAIL] == ["node09"]
    assert verdicts["node01"]["reasons"][0].startswith(
        "held back by the circuit breaker: circuit breaker, out-of-service limit"
    )
    # the window: one node isolated and resumed within it leaves no room for a new one
    window = CircuitBreaker(16, fraction=0.2, recent={"node05"})
    verdicts = capped(failing, room_of(window))
    assert [n for n, v in verdicts.items() if v["verdict"] == gate.FAIL] == []
    # a node the window already counts (isolated and resumed within it) takes no more of the window
    again = CircuitBreaker(16, fraction=0.2, recent={"node02"})
    verdicts = capped(failing, room_of(again))
    assert [n for n, v in verdicts.items() if v["verdict"] == gate.FAIL] == ["node02"]


def test_the_node_gate_reads_durations_as_stethoscope_gate_does() -> None:
    """A `--grace 10m` tried with `stethoscope gate` works as the node's own gate.py and in gate.json
    (standard library only there): the same syntax, the same seconds, the same refusals."""
    import argparse

    from stethoscope.telemetry.gate import add_arguments, duration_seconds
    from stethoscope.timeutil import parse_duration

    for text in ("90s", "15m", "1.5h", "2d", "1w", "300", "2.5", ".5", "10 m"):
        assert duration_seconds(text) == parse_duration(text), text
    for bad in ("", "10x", "-5", "m", "1e3", "nan", "0"):
        with pytest.raises(ValueError):
            duration_seconds(bad)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--grace", "10m", "--timeout", "0.4s"])
    assert (args.grace, args.timeout) == (600, 0.4)
