"""`stethoscope serve` as a process: HTTP on loopback, the stream stored, SIGTERM loses nothing; and the
stream's configuration errors exit 2 with a message."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from stethoscope.store.client import Store
from stethoscope.telemetry import wire
from stethoscope.telemetry.metric_set import load_sets

TOP = Path(__file__).resolve().parents[2]
SECRET = b"serve-test-secret-0123456789"


def _inventory(tmp_path: Path, keys: dict[str, int]) -> Path:
    hosts = "\n".join(f"    {host}: {{stethoscope_node_key: {key}}}" for host, key in keys.items())
    path = tmp_path / "hosts.yml"
    path.write_text(f"---\nall:\n  hosts:\n{hosts}\n")
    return path


def _cli(tmp_path: Path, dsn: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "stethoscope.cli",
        "--dsn",
        dsn,
        "--spool-dir",
        str(tmp_path / "spool"),
        *args,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TOP)}


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.secret"
    path.write_bytes(SECRET + b"\n")
    return path


def _start_serve(tmp_path: Path, dsn: str, secret_file: Path) -> tuple[subprocess.Popen, tuple, str]:
    inventory = _inventory(tmp_path, {"gpu-a": 1, "gpu-b": 2})
    proc = subprocess.Popen(
        [
            *_cli(tmp_path, dsn, "serve", "--inventory", str(inventory), "--secret-file", str(secret_file)),
            "--no-sweep",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--interval",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    line = proc.stdout.readline()
    match = re.search(r"udp ([\d.]+):(\d+), http (http://[\d.]+:\d+)", line)
    assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, (match[1], int(match[2])), match[3]


def _send_node_part(udp: tuple, count: int, every_ms: int, values_of, first_seq: int = 0) -> int:
    """`count` node-part samples of gpu-a (key 1) and gpu-b (key 2) from sequence number `first_seq`,
    `every_ms` apart up to now, as their agents send them; values_of(seq, slots) gives a sample's
    values. Returns the values sent."""
    import socket

    metric_set = load_sets()["gpu_node"]
    slots = len(metric_set.parts["node"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    now_ms = int(time.time() * 1000)
    sent = 0
    for node, key_number in (("gpu-a", 1), ("gpu-b", 2)):
        key = wire.node_secret(SECRET, node)
        for seq in range(first_seq, first_seq + count):
            values = values_of(seq, slots)
            datagram = wire.encode(
                key,
                set_id=metric_set.id,
                node_key=key_number,
                part=0,
                boot_epoch=1000,
                seq=seq,
                ts_ms=now_ms - (first_seq + count - seq) * every_ms,
                values=values,
            )
            sock.sendto(datagram, udp)
            sent += len(values)
    sock.close()
    return sent


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_stores_the_stream_serves_http_and_loses_nothing_on_sigterm(
    tmp_path: Path, secret_file: Path
) -> None:
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    proc, udp, http = _start_serve(tmp_path, dsn, secret_file)
    try:
        deadline = time.time() + 60
        status, body = _get(f"{http}/healthz")
        while json.loads(body)["cycles"] < 1 and time.time() < deadline:
            time.sleep(0.3)
            status, body = _get(f"{http}/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        status, metrics = _get(f"{http}/metrics")
        assert status == 200
        assert "stethoscope_cycles_total" in metrics and "stethoscope_telemetry_datagrams_total" in metrics
        status, report = _get(f"{http}/report")
        assert status == 200 and "<h1>Health board</h1>" in report
        sent = _send_node_part(udp, 40, 1000, lambda seq, slots: [float(i + seq) for i in range(slots)])
        proc.send_signal(signal.SIGTERM)  # within the collector's 1-second batch
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "serve stopped" in out
    with Store(dsn) as store:
        stored = store.query(
            f"SELECT count(), uniqExact(node_id, metric_name, timestamp) FROM {database}.metrics "
            "WHERE labels['source'] = 'stream'"
        )[0]
    assert stored == (sent, sent)


def test_duplicate_node_keys_refused_with_both_hosts_named(tmp_path: Path, secret_file: Path) -> None:
    inventory = _inventory(tmp_path, {"gpu-a": 7, "gpu-b": 7})
    run = subprocess.run(
        [
            *_cli(tmp_path, f"chdb://{tmp_path / 'db'}", "collector", "--inventory", str(inventory)),
            "--secret-file",
            str(secret_file),
            "--duration",
            "0",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert run.returncode == 2
    assert "stethoscope_node_key 7 is given to both gpu-a and gpu-b" in run.stderr
    assert "Traceback" not in run.stderr


def test_missing_cluster_secret_is_a_configuration_error(tmp_path: Path) -> None:
    inventory = _inventory(tmp_path, {"gpu-a": 1})
    run = subprocess.run(
        [
            *_cli(tmp_path, f"chdb://{tmp_path / 'db'}", "collector", "--inventory", str(inventory)),
            "--secret-file",
            str(tmp_path / "absent.secret"),
            "--duration",
            "0",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert run.returncode == 2
    assert "absent.secret" in run.stderr and "Traceback" not in run.stderr


def test_serve_playbook_installs_the_unit_check_mode_writes_nothing_and_reruns_change_nothing(
    tmp_path: Path,
) -> None:
    from conftest import ansible_env

    inventory = _inventory(tmp_path, {"gpu-a": 1})
    extra = json.dumps(
        {
            "serve_cluster_secret": "s" * 32,
            "serve_secret_file": str(tmp_path / "etc/cluster.secret"),
            "serve_unit_dir": str(tmp_path),
            "serve_systemd": False,
            "serve_user": os.environ.get("USER") or "root",
            "serve_group": subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip(),
        }
    )

    def play(*flags: str) -> str:
        run = subprocess.run(
            [
                str(Path(sys.executable).parent / "ansible-playbook"),
                "-i",
                str(inventory),
                "-c",
                "local",
                "-e",
                extra,
                *flags,
                str(TOP / "playbooks/serve.yml"),
            ],
            capture_output=True,
            text=True,
            env=ansible_env(tmp_path),
            timeout=300,
        )
        assert run.returncode == 0, run.stdout[-3000:]
        return run.stdout

    play("--check")
    assert not (tmp_path / "stethoscope-serve.service").exists()
    play()
    unit = (tmp_path / "stethoscope-serve.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert f"serve --inventory {inventory} --secret-file {tmp_path / 'etc/cluster.secret'}" in exec_start
    assert "--http 127.0.0.1:9976" in exec_start and "--execute" not in exec_start
    assert "--gate-listen" not in exec_start  # no verdicts unless asked
    assert oct((tmp_path / "etc/cluster.secret").stat().st_mode & 0o777) == "0o600"
    assert "changed=0" in play()
    assert "s" * 32 not in play("-v")
    play("-e", "serve_gate_listen=10.0.0.1:9977")
    unit = (tmp_path / "stethoscope-serve.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_start.endswith("--interval 60 --gate-listen 10.0.0.1:9977"), exec_start


class _Timed:
    """The agent's socket, recording when each datagram went out."""

    def __init__(self, sock):
        self.sock = sock
        self.sent: list[tuple[float, int, int]] = []  # (time, part, ts_ms)

    def sendto(self, data: bytes, address) -> int:
        header = wire.parse_header(data)
        self.sent.append((time.time(), header.part, header.ts_ms))
        return self.sock.sendto(data, address)


def test_serve_killed_loses_at_most_its_unflushed_second_and_resends_refill_it(
    tmp_path: Path, secret_file: Path
) -> None:
    from stethoscope.telemetry.keyring import Keyring
    from stethoscope.telemetry.lab import lab_agents, run_agents

    lab = tmp_path / "lab"
    env = {**os.environ, "STETHOSCOPE_LAB_DIR": str(lab)}
    subprocess.run([sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "1"], env=env, check=True)
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    inventory = _inventory(tmp_path, {"node01": 1})
    port = _free_udp_port()

    def start() -> tuple[subprocess.Popen, float]:
        proc = subprocess.Popen(
            [
                *_cli(
                    tmp_path, dsn, "serve", "--inventory", str(inventory), "--secret-file", str(secret_file)
                ),
                "--no-sweep",
                "--listen",
                f"127.0.0.1:{port}",
                "--http",
                "127.0.0.1:0",
                "--interval",
                "30",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        assert "serve: udp" in proc.stdout.readline()
        return proc, time.time()

    period = 5.0  # the stream's: resends cover 3 periods, serve must be back within 15 s
    first, _ready1 = start()
    agents = lab_agents(
        Keyring({1: "node01"}, [SECRET]), load_sets()["gpu_node"], f"127.0.0.1:{port}", period, directory=lab
    )
    agents[0].sock = timed = _Timed(agents[0].sock)
    import threading

    runner = threading.Thread(target=run_agents, args=(agents, None))
    runner.start()
    try:
        time.sleep(2.5 * period)
        killed_at = time.time()
        first.kill()  # kill -9: whatever it had not flushed is gone with it
        first.wait(timeout=30)
        time.sleep(period)  # down for a whole period: a sample is made while nobody listens
        second, ready_at = start()
        time.sleep(4 * period)
    finally:
        agents[0].stop.set()
        runner.join()
    second.send_signal(signal.SIGTERM)
    second.communicate(timeout=60)
    downtime = ready_at - killed_at
    with Store(dsn) as store:
        present = {
            ts
            for (ts,) in store.query(
                f"SELECT toUnixTimestamp64Milli(timestamp) FROM {database}.metrics "
                "WHERE metric_name = 'gpu_temperature_celsius' AND device = 'node' "
                "AND labels['source'] = 'stream'"
            )
        }
    copies: dict[int, list[float]] = {}
    for sent_at, part, ts in timed.sent:
        if part == wire.NODE_PART:
            copies.setdefault(ts, []).append(sent_at)
    flush_margin = 2.0  # the collector writes once a second; what is older than this was written
    must = {
        ts
        for ts, times in copies.items()
        if any(t > ready_at + 0.2 for t in times) or any(t < killed_at - flush_margin for t in times)
    }
    assert must <= present, f"missing {sorted(must - present)}, downtime {downtime:.1f} s"
    refilled = {ts for ts, times in copies.items() if killed_at - flush_margin <= min(times) <= ready_at}
    assert downtime < wire.REDUNDANCY * period, f"serve took {downtime:.1f} s to come back"
    assert refilled and refilled <= present  # made around the kill, stored from a resend after it


def _free_udp_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_finding_from_the_stream_alone_is_capped_at_l3_and_never_drains(store, tmp_path: Path) -> None:
    from stethoscope.catalog import Catalog
    from stethoscope.diagnosis.findings import diagnose
    from stethoscope.diagnosis.rules import load_rules
    from stethoscope.remediation.stream_cap import cap_stream_only, stream_only_metrics
    from stethoscope.store.batch import MetricColumns
    from stethoscope.timeutil import now_ms

    rules_file = tmp_path / "drain.yml"
    rules_file.write_text(
        "---\n"
        "- rule_id: stream_drain_test\n  description: a stream rule that would drain\n  severity: critical\n"
        "  level: L4\n  trigger:\n"
        "    - {metric: ib_port_xmit_wait_per_second, operator: '>', threshold: 10, window: 1m,\n"
        "       aggregate: max}\n"
        "- rule_id: sweep_drain_test\n  description: a sweep rule that would drain\n  severity: critical\n"
        "  level: L4\n  trigger:\n"
        "    - {metric: ib_port_state, operator: '!=', threshold: 4, window: 3m, aggregate: max}\n"
    )
    catalog = Catalog.load()
    loaded = load_rules(rules_file, catalog)
    assert loaded.errors == []
    at = now_ms() - 10_000
    rows = MetricColumns()
    for i in range(6):
        rows.append("n1", "ib_port_xmit_wait_per_second", "node", {"source": "stream"}, 500.0, at - i * 5000)
        rows.append("n1", "ib_port_state", "mlx5_0/1", {}, 1.0, at - i * 30_000)
    store.insert_metrics(rows)
    findings = {f["rule_id"]: f for f in diagnose(store, loaded.rules, at)}
    assert findings["stream_drain_test"]["level"] == "L4"
    assert any("drain" in action for action in findings["stream_drain_test"]["actions"])
    sets = {s.id: s for s in load_sets().values()}
    cap_stream_only(list(findings.values()), loaded.rules, stream_only_metrics(sets, catalog))
    capped, confirmed = findings["stream_drain_test"], findings["sweep_drain_test"]
    assert capped["level"] == "L3" and not any("drain" in action for action in capped["actions"])
    assert confirmed["level"] == "L4" and any("drain" in action for action in confirmed["actions"])


def test_a_model_finding_raised_to_l4_by_the_inventory_is_capped_in_serve_and_never_drains() -> None:
    # the model reads the stream: its evidence is the stream's alone, whatever level the inventory sets
    from stethoscope.diagnosis.findings import LEVEL_ACTIONS, action_label
    from stethoscope.remediation.stream_cap import cap_stream_only

    plan = LEVEL_ACTIONS["L4"]
    finding = {
        "rule_id": "model.communication",
        "level": "L4",
        "plan": plan,
        "actions": [action_label(a) for a in plan],
    }
    assert any("drain" in action for action in finding["actions"])
    cap_stream_only([finding], [], set())
    assert finding["level"] == "L3" and not any("drain" in action for action in finding["actions"])


def test_serve_execute_acts_once_per_stream_finding_across_cycles(tmp_path: Path, secret_file: Path) -> None:
    """serve --execute end to end: datagrams -> collector -> store -> a stream rule -> the executor's
    log action; one finding per node, one transaction, one action, however many cycles it stays
    open while the agents keep sending."""
    import threading

    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    log = tmp_path / "findings.log"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "---\nall:\n  vars:\n"
        f"    stethoscope_diagnose_log: {log}\n"
        "  hosts:\n    gpu-a: {stethoscope_node_key: 1}\n    gpu-b: {stethoscope_node_key: 2}\n"
    )
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "stream.yml").write_text(
        "---\n- rule_id: stream_xmit_wait_test\n  description: the port waits to send\n"
        "  severity: warning\n  level: L1\n  trigger:\n"
        "    - {metric: ib_port_xmit_wait_per_second, operator: '>', threshold: 10, window: 1m,\n"
        "       aggregate: max}\n"
    )
    command = _cli(tmp_path, dsn, "serve", "--inventory", str(inventory), "--secret-file", str(secret_file))
    options = ["--rules", str(rules), "--execute", "--no-model", "--interval", "1", "--no-sweep"]
    proc = subprocess.Popen(
        [*command, *options, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    stop = threading.Event()
    try:
        match = re.search(r"udp ([\d.]+):(\d+), http (http://[\d.]+:\d+)", proc.stdout.readline())
        assert match, proc.stderr.read() if proc.poll() is not None else ""
        udp, http = (match[1], int(match[2])), match[3]

        def agents() -> None:  # both nodes send a sample a second as long as the test runs
            seq = 0
            while not stop.is_set():
                _send_node_part(udp, 1, 0, lambda _, slots: [500.0] * slots, first_seq=seq)
                seq += 1
                stop.wait(1.0)

        sender = threading.Thread(target=agents, daemon=True)
        sender.start()

        def cycles() -> int:
            return json.loads(_get(f"{http}/healthz")[1])["cycles"]

        deadline = time.time() + 60
        while time.time() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 2):
            time.sleep(0.3)
        first = cycles()
        while time.time() < deadline and cycles() < first + 3:
            time.sleep(0.3)
        later = cycles()
        stop.set()
        sender.join()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert later >= first + 3  # the findings stayed open over three more cycles
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    # before the first datagram the store held nothing of the inventory's nodes: UNKNOWN, once
    assert [e["rule_id"] for e in entries if e["rule_id"].startswith("unknown.")] in ([], ["unknown.fleet"])
    entries = [e for e in entries if not e["rule_id"].startswith("unknown.")]
    assert sorted((e["rule_id"], e["node_id"]) for e in entries) == [
        ("stream_xmit_wait_test", "gpu-a"),
        ("stream_xmit_wait_test", "gpu-b"),
    ], entries
    with Store(dsn) as store:
        findings = store.query(
            f"SELECT node_id, argMax(txn_id, version), argMax(status, version) FROM {database}.findings "
            "WHERE rule_id = 'stream_xmit_wait_test' GROUP BY finding_id, node_id ORDER BY node_id"
        )
        actions = store.query(
            f"SELECT txn_id, action, argMax(status, version) FROM {database}.actions WHERE finding_id IN "
            f"(SELECT finding_id FROM {database}.findings WHERE rule_id = 'stream_xmit_wait_test') "
            "GROUP BY txn_id, finding_id, action, target"
        )
    assert [(node, status) for node, _, status in findings] == [("gpu-a", "open"), ("gpu-b", "open")]
    assert sorted((txn, action, status) for txn, action, status in actions) == sorted(
        (txn, "log", "ok") for _, txn, _ in findings
    )
