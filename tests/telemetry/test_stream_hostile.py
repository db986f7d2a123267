"""The stream against hostile or broken senders, on loopback: a validly signed datagram
carrying ±Inf stores its finite values and counts the others by reason, never the Inf; the wire
decoder never yields a non-finite value; exact replays stay refused across a collector restart (the
replay window is persisted per node and boot epoch); a busy UDP port is exit 2 naming the address."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stethoscope.store.client import Store
from stethoscope.store.writer import Writer
from stethoscope.telemetry import wire
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

from conftest import TOP

SECRET = b"hostile-stream-secret-0123456789"
NODES = {1: "node01", 2: "node02"}


def datagram(seq: int, values, node_key: int = 1, boot_epoch: int = 700, ts_ms: int | None = None) -> bytes:
    metric_set = load_sets()["gpu_node"]
    return wire.encode(
        wire.node_secret(SECRET, NODES[node_key]),
        set_id=metric_set.id,
        node_key=node_key,
        part=0,
        boot_epoch=boot_epoch,
        seq=seq,
        ts_ms=int(time.time() * 1000) if ts_ms is None else ts_ms,
        values=values,
    )


def send(address, *datagrams: bytes) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for data in datagrams:
        sock.sendto(data, address)
    sock.close()


def test_the_wire_decoder_never_yields_a_non_finite_value():
    data = datagram(1, [math.inf, 40.0, -math.inf, 50.0, math.nan])
    sample = wire.decode(data, lambda _key: [wire.node_secret(SECRET, "node01")], int(time.time() * 1000))
    assert isinstance(sample, wire.Sample)
    assert not any(math.isinf(value) for value in sample.values)
    assert [v for v in sample.values if not math.isnan(v)] == [40.0, 50.0] and sample.nonfinite == 2


def test_a_signed_datagram_with_inf_stores_its_finite_values_and_counts_the_rest(tmp_path):
    """Regression: the collector dropped NaN but stored ±Inf, and one +Inf then failed a has_bits
    rule and with it every cycle of the fleet."""
    metric_set = load_sets()["gpu_node"]
    dsn = f"chdb://{tmp_path / 'db'}"
    collector = Collector(
        Keyring(dict(NODES), [SECRET]), {metric_set.id: metric_set}, Writer(dsn, tmp_path / "spool").write
    ).start()
    values = [40.0] * len(metric_set.parts["node"])
    values[0], values[3] = math.inf, -math.inf
    send(collector.address, datagram(1, values), datagram(2, [41.0] * len(values)))
    deadline = time.time() + 10
    while collector.stats.datagrams < 2 and time.time() < deadline:
        time.sleep(0.05)
    collector.stop()
    with Store(dsn) as store:
        stream = store.query(
            "SELECT count(), countIf(NOT isFinite(value)) FROM stethoscope.metrics "
            "WHERE node_id = 'node01' AND labels['source'] = 'stream'"
        )[0]
        counted = store.query(
            "SELECT labels['reason'], max(value) FROM stethoscope.metrics "
            "WHERE metric_name = 'telemetry_values_rejected_total' GROUP BY 1"
        )
    assert stream == (2 * len(values) - 2, 0)
    assert dict(counted)["nonfinite"] == 2.0
    assert collector.stats.values_rejected == {"nonfinite": 2}


def _free_udp_port() -> int:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return port


def _stream_cli(tmp_path: Path, port: int, duration: float, command: str = "collector") -> subprocess.Popen:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "---\nall:\n  hosts:\n"
        + "".join(f"    {n}: {{stethoscope_node_key: {k}}}\n" for k, n in NODES.items())
    )
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    env = {**os.environ, "STETHOSCOPE_HOME": str(tmp_path / "home")}
    own = ["--duration", str(duration)] if command == "collector" else ["--no-sweep", "--http", "127.0.0.1:0"]
    argv = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", f"chdb://{tmp_path / 'db'}",
        "--spool-dir", str(tmp_path / "spool"), command, "--inventory", str(inventory),
        "--secret-file", str(secret), "--listen", f"127.0.0.1:{port}", *own,
    ]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP, env=env)


def _run_and_send(tmp_path: Path, port: int, datagrams: list[bytes]) -> str:
    proc = _stream_cli(tmp_path, port, duration=4)
    assert proc.stdout is not None
    head = proc.stdout.readline()
    assert head.startswith("collector on udp"), head + (proc.stderr.read() if proc.stderr else "")
    send(("127.0.0.1", port), *datagrams)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return out


def test_exact_replays_stay_refused_after_a_collector_restart(tmp_path):
    """Regression: the replay guard lived in memory only; after a restart the same signed datagrams
    were accepted again."""
    port = _free_udp_port()
    now = int(time.time() * 1000)
    first = [datagram(seq, [40.0 + seq], ts_ms=now - 5000 * (5 - seq)) for seq in range(6)]
    out = _run_and_send(tmp_path, port, first)
    assert "0 rejected" in out, out
    lost_then_resent = datagram(6, [46.0], ts_ms=now + 1)  # never arrived before: a resend recovers it
    replayed = _run_and_send(tmp_path, port, [*first, lost_then_resent, datagram(7, [47.0], ts_ms=now + 2)])
    counts = re.search(r"(\d+) duplicates, (\d+) rejected \{(.*)\}", replayed)
    assert counts, replayed
    assert int(counts[1]) + int(counts[2]) == 6, replayed  # all six were kept before
    assert "'replayed'" in counts[3] or int(counts[1]) == 6
    with Store(f"chdb://{tmp_path / 'db'}") as store:
        kept = store.query(
            "SELECT count(), uniqExact(timestamp) FROM stethoscope.metrics "
            "WHERE node_id = 'node01' AND metric_name = 'gpu_temperature_celsius'"
        )[0]
    assert kept == (8, 8)  # seqs 0..7, each stored once


@pytest.mark.parametrize("command", ["collector", "serve"])
def test_a_busy_udp_port_is_exit_2_naming_the_address(tmp_path, command):
    """Regression: `collector --listen` on a port in use was "internal error: OSError ... Address
    already in use", exit 3, without the address."""
    busy = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    busy.bind(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    try:
        proc = _stream_cli(tmp_path, port, duration=1, command=command)
        _out, err = proc.communicate(timeout=120)
    finally:
        busy.close()
    assert proc.returncode == 2, err
    assert f"--listen 127.0.0.1:{port}: cannot listen there: Address already in use" in err
    assert "Traceback" not in err and "internal error" not in err
    assert not (tmp_path / "db").exists()  # refused before the database was held
