"""An agent that sends to two collectors loses nothing while one of them restarts: real processes on
loopback (serve holding the store and collecting, a second `stethoscope collector` writing through
serve's relay, the node's agent.py as the role copies it), and the store's replacing key keeps each
sample once although both collectors stored it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

from stethoscope.store.client import Store
from stethoscope.telemetry import wire
from stethoscope.telemetry.agent import Agent
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.lab import agent_config
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

TOP = Path(__file__).resolve().parents[2]
AGENT = TOP / "roles/push_agent/files/agent.py"
SECRET = b"two-collectors-secret-0123456789"
PERIOD = 1.0  # resends cover 3 periods: a collector down for 6 s is down past them
DOWN = 2 * wire.REDUNDANCY * PERIOD


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Tap:
    """A third address the agent sends to: what it made, (part, ts_ms) of each datagram."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.made: set[tuple[int, int]] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.sock.getsockname()[1]

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            header = wire.parse_header(data)
            self.made.add((header.part, header.ts_ms))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TOP), "STETHOSCOPE_HOME": str(home)}


def _stethoscope(tmp_path: Path, dsn: str, home: Path, *args: str) -> subprocess.Popen:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("---\nall:\n  hosts:\n    node01: {stethoscope_node_key: 1}\n")
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(home / "spool")]
    stream = ["--inventory", str(inventory), "--secret-file", str(secret)]
    return subprocess.Popen(
        [*command, *args[:1], *stream, *args[1:]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(home),
    )


def _ready(proc: subprocess.Popen, pattern: str) -> None:
    line = proc.stdout.readline()
    assert re.search(pattern, line), (line, proc.stderr.read() if proc.poll() is not None else "")


def _collector(tmp_path: Path, dsn: str, port: int) -> subprocess.Popen:
    proc = _stethoscope(tmp_path, dsn, tmp_path / "second", "collector", "--listen", f"127.0.0.1:{port}")
    _ready(proc, r"collector on udp")
    return proc


def _stored_node_samples(store: Store, final: str) -> dict[int, int]:
    rows = store.query(
        f"SELECT toUnixTimestamp64Milli(timestamp), count() FROM {store.database}.metrics {final} "
        "WHERE metric_name = 'gpu_temperature_celsius' AND device = 'node' "
        "AND labels['source'] = 'stream' GROUP BY timestamp"
    )
    return dict(rows)


def _agent_json(tmp_path: Path, collector: object) -> Path:
    config = agent_config(
        "node01", Keyring({1: "node01"}, [SECRET]), load_sets()["gpu_node"], "127.0.0.1:9", tmp_path, 5
    )
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({**config, "gpu_source": "none", "collector": collector}))
    return path


def _run_agent(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(AGENT), *args, "--duration", "0"], capture_output=True, text=True, timeout=60
    )


def test_agent_config_names_several_collectors_and_sends_each_datagram_to_each(tmp_path: Path) -> None:
    receivers = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(2)]
    for receiver in receivers:
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(5)
    addresses = ["127.0.0.1:%d" % receiver.getsockname()[1] for receiver in receivers]
    config = json.loads(_agent_json(tmp_path, addresses).read_text())
    agent = Agent(config)
    assert agent.addresses == [("127.0.0.1", receiver.getsockname()[1]) for receiver in receivers]
    agent.tick(0, time.time())
    copies = [wire.parse_header(receiver.recv(65536)) for receiver in receivers]
    assert copies[0] == copies[1] and agent.counters.send_errors == 0
    for receiver in receivers:
        receiver.close()


def test_collector_option_replaces_the_configs_and_a_bad_address_is_named(tmp_path: Path) -> None:
    config = _agent_json(tmp_path, ["127.0.0.1:9", "nowhere"])
    bad = _run_agent("--config", str(config))
    assert bad.returncode == 2 and "nowhere" in bad.stderr
    good = _run_agent("--config", str(config), "--collector", "127.0.0.1:9", "--collector", "127.0.0.2:9")
    assert good.returncode == 0, good.stderr


class Run:
    """What one run made and stored: the node part's sample times the agent made, those made while the
    second collector was down, when it was back, and the stored samples (count per time)."""

    made: set[int]
    gap: set[int]
    back_at: float
    final: dict[int, int]  # read with FINAL, as the rules read
    merged: dict[int, int]  # read plainly after OPTIMIZE ... FINAL merged every part
    second_stored: int  # rows the restarted collector stored


def _second_collector_restarted(tmp_path: Path, agent_sends_to_serve: bool) -> Run:
    """serve (collecting, holding the store) and a second collector; the agent sends to the second,
    and to serve where asked; the second is killed, down for twice the resends' reach, and restarted."""
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "1"],
        env={**os.environ, "STETHOSCOPE_LAB_DIR": str(tmp_path / "lab")},
        check=True,
    )
    database = f"t_{uuid.uuid4().hex[:8]}"
    dsn = f"chdb://{tmp_path / 'db'}?database={database}"
    first_port, second_port = _free_udp_port(), _free_udp_port()
    serve = _stethoscope(
        tmp_path, dsn, tmp_path / "first", "serve", "--no-sweep", "--listen", f"127.0.0.1:{first_port}",
        "--http", "127.0.0.1:0", "--interval", "600",
    )  # fmt: skip
    _ready(serve, r"serve: udp")
    second = _collector(tmp_path, dsn, second_port)
    tap = Tap()
    config = agent_config(
        "node01",
        Keyring({1: "node01"}, [SECRET]),
        load_sets()["gpu_node"],
        f"127.0.0.1:{second_port}",
        tmp_path / "lab/nodes/node01/root",
        PERIOD,
    )
    collectors = [f"127.0.0.1:{first_port}"] if agent_sends_to_serve else []
    config["collector"] = [*collectors, f"127.0.0.1:{second_port}", tap.address]
    config["state_dir"] = str(tmp_path / "agent-state")
    (tmp_path / "agent.json").write_text(json.dumps(config))
    agent = subprocess.Popen(
        [sys.executable, str(AGENT), "--config", str(tmp_path / "agent.json")],
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    run = Run()
    try:
        time.sleep(3 * PERIOD)
        second.kill()  # kill -9: what it had not flushed is gone with it
        second.wait(timeout=30)
        killed_at = time.time()
        time.sleep(DOWN)
        second = _collector(tmp_path, dsn, second_port)
        run.back_at = time.time()
        time.sleep(4 * PERIOD)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent_err = agent.communicate(timeout=30)[1]
        time.sleep(2.0)  # the collectors write once a second
        second.send_signal(signal.SIGTERM)
        second_out = second.communicate(timeout=60)[0]
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=120)
        tap.close()
    assert agent.returncode == 0, agent_err
    assert run.back_at - killed_at > wire.REDUNDANCY * PERIOD
    run.made = {ts for part, ts in tap.made if part == wire.NODE_PART}
    run.gap = {ts for ts in run.made if killed_at < ts / 1000 < run.back_at}
    assert len(run.gap) >= DOWN - 1
    run.second_stored = int(re.search(r"(\d+) rows stored", second_out)[1])
    with Store(dsn) as store:
        run.final = _stored_node_samples(store, "FINAL")
        store.command(f"OPTIMIZE TABLE {database}.metrics FINAL")
        run.merged = _stored_node_samples(store, "")
    return run


def test_two_collectors_one_restarted_past_the_resends_every_sample_stored_once(tmp_path: Path) -> None:
    run = _second_collector_restarted(tmp_path, agent_sends_to_serve=True)
    assert run.gap <= set(run.final), f"lost {sorted(run.gap - set(run.final))}"
    assert run.made <= set(run.final), f"lost {sorted(run.made - set(run.final))}"
    assert run.second_stored > 0  # the restarted collector stored its copies too: duplicates of serve's
    assert set(run.final.values()) == {1}
    assert run.merged == run.final


def test_one_collector_restarted_past_the_resends_loses_the_gap(tmp_path: Path) -> None:
    """The limit two collectors lift: a sample made more than the resends' reach before its only
    collector is back has no copy left to arrive."""
    run = _second_collector_restarted(tmp_path, agent_sends_to_serve=False)
    beyond_resends = {ts for ts in run.gap if ts / 1000 < run.back_at - (wire.REDUNDANCY + 1) * PERIOD}
    assert beyond_resends and not beyond_resends & set(run.final)


class Sent:
    """The agent's socket: where each datagram went; it refuses the first `refuse` sends."""

    def __init__(self, refuse: int = 0) -> None:
        self.addresses: list[tuple] = []
        self.refuse = refuse

    def sendto(self, data: bytes, address: tuple) -> None:
        if self.refuse:
            self.refuse -= 1
            raise OSError("no route to host")
        self.addresses.append(address)


class Lookups:
    """socket.getaddrinfo, counted."""

    def __init__(self) -> None:
        self.real, self.hosts = socket.getaddrinfo, []

    def __call__(self, host, *args, **kwargs):
        self.hosts.append(host)
        return self.real(host, *args, **kwargs)


def test_a_collector_named_by_host_is_looked_up_once_at_start_not_per_datagram(tmp_path, monkeypatch) -> None:
    lookups = Lookups()
    monkeypatch.setattr(socket, "getaddrinfo", lookups)
    sent = Sent()
    agent = Agent(json.loads(_agent_json(tmp_path, ["localhost:9975"]).read_text()), sock=sent)
    for seq in range(3):
        agent.tick(seq, time.time())
    assert len(sent.addresses) > 3 and set(sent.addresses) <= {("127.0.0.1", 9975), ("::1", 9975, 0, 0)}
    assert lookups.hosts == ["localhost"]


def test_a_send_error_looks_the_collector_up_again(tmp_path, monkeypatch) -> None:
    lookups = Lookups()
    monkeypatch.setattr(socket, "getaddrinfo", lookups)
    agent = Agent(json.loads(_agent_json(tmp_path, ["localhost:9975"]).read_text()), sock=Sent(refuse=1))
    agent.tick(0, time.time())
    agent.tick(1, time.time())
    assert agent.counters.send_errors == 1
    assert lookups.hosts == ["localhost", "localhost"]


def test_an_ipv6_collector_is_sent_to_through_an_ipv6_socket(tmp_path: Path) -> None:
    receiver = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    receiver.bind(("::1", 0))
    receiver.settimeout(5)
    try:
        config = json.loads(_agent_json(tmp_path, ["[::1]:%d" % receiver.getsockname()[1]]).read_text())
        agent = Agent(config)
        agent.tick(0, time.time())
        assert wire.parse_header(receiver.recv(65536)).part is not None
        assert agent.counters.send_errors == 0
    finally:
        receiver.close()


def test_an_unknown_collector_host_is_named_at_start(tmp_path: Path) -> None:
    config = _agent_json(tmp_path, ["collector.invalid:9975"])
    run = _run_agent("--config", str(config))
    assert run.returncode == 2 and "collector.invalid:9975" in run.stderr


def test_the_roles_preflight_refuses_a_port_outside_1_to_65535() -> None:
    (preflight,) = yaml.safe_load((TOP / "roles/push_agent/tasks/main.yml").read_text())[:1]
    (given,) = [task for task in preflight["block"] if "collector" in task["name"]]
    assert "reject('regex', _push_agent_collector_pattern)" in " ".join(
        given["ansible.builtin.assert"]["that"]
    )
    pattern = given["vars"]["_push_agent_collector_pattern"]
    for good in ("collector-1:9975", "10.0.0.5:1", "[fd00::5]:65535", "c.example:443"):
        assert re.search(pattern, good), good
    for bad in ("collector-1:0", "collector-1:65536", "collector-1:99999", "collector-1:", "collector-1"):
        assert not re.search(pattern, bad), bad


def test_each_collector_counts_the_packets_it_received_in_a_series_of_its_own() -> None:
    rows: dict[str, list[dict]] = {}
    for collector_id in ("collector-a", "collector-b"):
        collector = Collector(
            Keyring({1: "node01"}, [SECRET]), load_sets(), sink=lambda batch: None, collector_id=collector_id
        )
        collector.sock.close()
        collector.stats.received["node01"] += 7
        rows[collector_id] = [
            row
            for row in collector.health_rows(1_000).rows()
            if row["metric_name"] in ("telemetry_packets_received_total", "telemetry_packets_lost_total")
        ]
    for collector_id, counted in rows.items():
        assert len(counted) == 2 and all(row["node_id"] == "node01" for row in counted)
        assert all(row["labels"] == {"collector": collector_id} for row in counted), counted
