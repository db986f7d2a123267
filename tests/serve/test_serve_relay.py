"""Every command works while `serve` holds the embedded database: serve answers their statements
through its relay socket (serve/relay.py), with the same output and exit code as direct, never a lock
error; writes land; a playbook-style process given serve's DSN reads through it; a broken message
gets an error answer and serve answers others; only serve's own user may connect."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import pickle
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy
import pytest
from test_execute import AT, NODES, db, diagnose, execute_args, rules, worn

from stethoscope.serve.relay import peer_allowed
from stethoscope.store import relay_wire
from stethoscope.store.client import Store

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute
SECRET = b"serve-relay-secret-0123456789"
READS = [
    ("summary",),
    ("top", "gpu_temperature_celsius"),
    ("spool", "status"),
    ("report",),
]
LOCKED = ("Cannot lock", "in use by another process", "waiting up to")


def _cli(dsn: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, *args]
    environment = {**os.environ, "STETHOSCOPE_OPEN_WAIT": "1", **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, env=environment, timeout=120)


def _answer(result: subprocess.CompletedProcess) -> tuple[int, str]:
    """Exit code and output, less the lines of serve's collector's own health rows (its host's: they
    grow while it runs)."""
    assert result.returncode in (0, 1), result.stderr
    assert not any(word in result.stderr for word in LOCKED), result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.startswith(f"{socket.gethostname()} ")]
    return result.returncode, "\n".join(lines)


@pytest.fixture
def incidents(tmp_path, db, http_standin):
    """node03's and node05's worn SSDs, each an incident with its alert sent (diagnose --execute)."""
    hook = http_standin()
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}])
    with Store(db) as store:
        worn(store, "node03")
        worn(store, "node05")
    findings, _ = diagnose(
        tmp_path, db, rule_dir, *execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")
    )
    return rule_dir, {f["node_id"]: f["txn_id"] for f in findings}


@pytest.fixture
def serve(tmp_path, db):
    """`serve` as a process on the test's embedded database (rules only), its first cycle done;
    stopped after."""
    with serving(tmp_path, db, "--no-model") as proc:
        yield proc


@contextlib.contextmanager
def serving(tmp_path: Path, db: str, *options: str):
    """`serve` with `options` on the test's embedded database, its inventory tmp_path/serve-hosts.yml,
    from its first cycle done until the block ends."""
    inventory = tmp_path / "serve-hosts.yml"
    keys = "\n".join(f"    {node}: {{stethoscope_node_key: {i}}}" for i, node in enumerate(NODES, 1))
    inventory.write_text(f"---\nall:\n  hosts:\n{keys}\n")
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", db, "--spool-dir", str(tmp_path / "serve-spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-sweep", *options,
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "3600", "--log-format", "json",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline()
        assert head.startswith("serve: udp"), head + (proc.stderr.read() if proc.poll() is not None else "")
        cycle = proc.stdout.readline()  # the first cycle ran: nothing more writes until the test ends
        assert json.loads(cycle)["event"] == "cycle", cycle
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _stop(proc: subprocess.Popen) -> str:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return err


def _socket_of(dsn: str) -> str:
    holder = json.loads(Path(f"{dsn.removeprefix('chdb://')}.holder").read_text())
    return holder["socket"]


def test_every_command_answers_beside_serve_as_it_does_direct(tmp_path, db, incidents, serve):
    rule_dir, txns = incidents
    fixed = ("diagnose", "--json", "--rules", str(rule_dir), "--at", str(AT / 1000))
    beside = {args: _answer(_cli(db, *args)) for args in [*READS, fixed]}
    assert beside[fixed][0] == 1 and {f["node_id"] for f in json.loads(beside[fixed][1])} == {
        "node03",
        "node05",
    }

    acked = _cli(db, "incidents", "ack", txns["node03"], "--by", "alice", "--note", "beside serve")
    assert acked.returncode == 0, acked.stderr
    assert acked.stdout.strip() == f"incident {txns['node03']} (node03 sda) acknowledged by alice"
    fault = ("--node", "node05", "--kind", "ssd_wear", "--layer", "storage", "--impact", "latest")
    added = _cli(db, "fault", "add", *fault, "--note", "beside serve")
    assert added.returncode == 0, added.stderr
    written = [("incidents",), ("actions",), ("fault", "list")]
    after_writes = {args: _answer(_cli(db, *args)) for args in written}
    (line,) = [x for x in after_writes[("incidents",)][1].splitlines() if x.startswith(txns["node03"])]
    assert line.split()[4] == "acknowledged"
    assert "beside serve" in after_writes[("fault", "list")][1]

    _stop(serve)
    for args, answered in beside.items():
        assert _answer(_cli(db, *args)) == answered, args
    for args, answered in after_writes.items():
        assert _answer(_cli(db, *args)) == answered, args


def test_a_playbook_style_process_reads_writes_and_takes_a_reader_through_serve(db, serve):
    """A process given only STETHOSCOPE_DSN (what serve hands its playbooks) and no wait at all."""
    stamp = (int(time.time()) - 60) * 1000 + 123  # within the raw rows' TTL
    stored_at = datetime.datetime.fromtimestamp(stamp / 1000, datetime.UTC).replace(tzinfo=None).isoformat()
    probe = textwrap.dedent("""
        import datetime, json, sys
        from stethoscope.store.batch import MetricColumns
        from stethoscope.store.client import Store, SchemaMissing
        with Store() as store:
            db = store.database
            batch = MetricColumns()
            batch.append("node07", "gpu_temperature_celsius", "gpu0", {"job": "j1"}, 71.5, int(sys.argv[1]))
            store.insert_metrics(batch)
            sql = f"SELECT labels, value, timestamp FROM {db}.metrics WHERE node_id = {{n:String}}"
            rows = store.query(sql, {"n": "node07"})
            at = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.timezone.utc)
            sql = "SELECT {t:DateTime64(3, 'UTC')}, {a:Array(UInt8)}"
            echoed = store.query(sql, {"t": at, "a": [1, 2]})
            reader = store.reader()
            table = reader.query_arrow(f"SELECT node_id, value FROM {db}.metrics WHERE node_id = 'node07'")
            reader.close()
            try:
                store.query("SELECT 1 FROM no_such_db.metrics")
            except SchemaMissing as exc:
                missing = str(exc)
            print(json.dumps({
                "rows": [[r[0], r[1], r[2].isoformat()] for r in rows],
                "echoed": [echoed[0][0].isoformat(), echoed[0][1]],
                "arrow": table.to_pylist(),
                "missing": missing,
            }))
    """)
    env = {**os.environ, "STETHOSCOPE_DSN": db, "STETHOSCOPE_OPEN_WAIT": "0"}
    result = subprocess.run(
        [sys.executable, "-c", probe, str(stamp)], capture_output=True, text=True, cwd=TOP, env=env
    )
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["rows"] == [[{"job": "j1"}, 71.5, stored_at]]
    assert answer["echoed"] == ["2026-01-02T03:04:05.678000", [1, 2]]
    assert answer["arrow"] == [{"node_id": "node07", "value": 71.5}]
    assert "no_such_db" in answer["missing"] and "db init" in answer["missing"]
    assert not any(word in result.stderr for word in LOCKED), result.stderr


def test_a_broken_message_gets_an_error_answer_and_serve_answers_others(db, serve):
    path = _socket_of(db)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as garbage:
        garbage.settimeout(30)
        garbage.connect(path)
        garbage.sendall(b"\xff" * 64)  # a length far over the bound
        reply = relay_wire.receive(garbage, relay_wire.MAX_REPLY_BYTES)
        assert reply is not None and reply[0]["ok"] is False and "over the relay's bound" in reply[0]["error"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sly:
        sly.settimeout(30)
        sly.connect(path)
        # values that would run code on load: refused, and the connection goes on
        relay_wire.send(sly, {"op": "query", "sql": "SELECT 1"}, pickle.dumps({"parameters": os.getcwd}))
        refused = relay_wire.receive(sly, relay_wire.MAX_REPLY_BYTES)
        assert refused is not None and "not a value the relay carries" in refused[0]["error"]
        relay_wire.send(sly, {"op": "query", "sql": "SELECT 41 + 1"}, relay_wire.dump_values({}))
        fine = relay_wire.receive(sly, relay_wire.MAX_REPLY_BYTES)
        assert fine is not None and fine[0]["ok"] and relay_wire.load_values(fine[1]) == [(42,)]
    summary = _cli(db, "summary")
    assert summary.returncode in (0, 1) and not any(word in summary.stderr for word in LOCKED), summary.stderr
    assert serve.poll() is None
    _stop(serve)
    assert not Path(path).exists()  # withdrawn on stop


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another uid needs root")
def test_another_user_cannot_reach_the_relay(db, serve):
    path = _socket_of(db)
    attempt = textwrap.dedent(f"""
        import os, socket
        os.setgid(65534); os.setuid(65534)
        try:
            socket.socket(socket.AF_UNIX).connect({path!r})
        except PermissionError:
            print("refused")
    """)
    result = subprocess.run([sys.executable, "-c", attempt], capture_output=True, text=True)
    assert result.stdout.strip() == "refused", result.stderr


def test_only_serves_own_uid_is_answered():
    assert peer_allowed(1000, own_uid=1000)
    assert not peer_allowed(1001, own_uid=1000)
    assert not peer_allowed(0, own_uid=1000)  # root too: it has its own database
    assert peer_allowed(os.getuid())


def test_the_unpickler_builds_plain_values_only():
    import datetime
    import decimal
    import uuid

    values = {
        "t": datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
        "d": decimal.Decimal("1.50"),
        "u": uuid.UUID(int=7),
        "m": {"a": [1, 2, (3, None)]},
        "s": frozenset({"x"}),
    }
    assert relay_wire.load_values(relay_wire.dump_values(values)) == values
    scores = {"confidence": numpy.float64(0.75), "ranks": numpy.arange(3)}
    assert relay_wire.load_values(relay_wire.dump_values(scores)) == {"confidence": 0.75, "ranks": [0, 1, 2]}
    for sly in (os.system, subprocess.Popen, re.compile):
        with pytest.raises(relay_wire.WireError, match="not a value the relay carries"):
            relay_wire.load_values(pickle.dumps(sly))


def test_a_subclass_of_a_plain_type_crosses_the_wire_as_its_plain_value():
    """Ansible's tagged strings (an inventory's host names) and the like go as plain values."""

    class Tagged(str):
        pass

    class Count(int):
        pass

    values = {"nodes": [Tagged("node01")], "n": Count(3), "flag": True}
    loaded = relay_wire.load_values(relay_wire.dump_values(values))
    assert loaded == {"nodes": ["node01"], "n": 3, "flag": True}
    assert type(loaded["nodes"][0]) is str and type(loaded["n"]) is int and loaded["flag"] is True
