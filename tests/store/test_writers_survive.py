"""Writers that cannot die silently, on real disks: a spool on a full tmpfs and a
database folder on a read-only bind mount. What can be neither stored nor spooled is held in memory
(bounded, counted as at risk, the oldest dropped and counted as lost beyond the bound), retried at
each flush and stored once the disk or the store comes back; /healthz says degraded meanwhile."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_stream_hostile import NODES, SECRET, datagram, send
from test_telemetry_serve import SECRET as SERVE_SECRET
from test_telemetry_serve import _get, _send_node_part, _start_serve

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import ConfigError
from stethoscope.store.writer import Writer
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector

from conftest import ansible_env

SLOTS = len(load_sets()["gpu_node"].parts["node"])  # rows of one node-part datagram


def _mount(*args: str) -> None:
    run = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if run.returncode != 0:
        pytest.skip(
            f"needs root to mount a tmpfs or a read-only bind mount: mount {' '.join(args)}: {run.stderr}"
        )


@contextlib.contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A small disk of its own at `folder`, unmounted when the block ends."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Callable[[], None]]:
    """`folder` read-only (bound onto itself, remounted ro) until the block ends or the function it
    yields makes it writable again."""
    _mount("--bind", str(folder), str(folder))
    try:
        _mount("-o", "remount,ro,bind", str(folder))
        yield lambda: _mount("-o", "remount,rw,bind", str(folder))
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Take every free block of the disk under `folder`; unlink the file returned to free them."""
    ballast = folder / "ballast"
    with open(ballast, "wb", buffering=0) as handle, contextlib.suppress(OSError):
        while True:
            handle.write(b"\0" * 65536)
    return ballast


def initialised(folder: Path) -> str:
    dsn = f"chdb://{folder / 'db'}"
    with Store(dsn) as store:
        store.init_schema()
    return dsn


def stream_rows(dsn: str) -> list[tuple[str, int]]:
    with Store(dsn) as store:
        return store.query(
            "SELECT node_id, toUnixTimestamp64Milli(timestamp) FROM stethoscope.metrics FINAL "
            "WHERE labels['source'] = 'stream' ORDER BY timestamp, node_id, metric_name"
        )


def wait_for(condition: Callable[[], object], seconds: float = 20.0) -> object:
    deadline = time.monotonic() + seconds
    while not (outcome := condition()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return outcome


def collector_of(dsn: str, spool_dir: Path, **options: object) -> Collector:
    metric_set = load_sets()["gpu_node"]
    writer = Writer(dsn, spool_dir, timeout=10)
    return Collector(Keyring(dict(NODES), [SECRET]), {metric_set.id: metric_set}, writer.write, **options)


def burst(first_seq: int, count: int) -> list[bytes]:
    now = int(time.time() * 1000)
    return [
        datagram(seq, [40.0 + seq % 7] * SLOTS, ts_ms=now - 1000 + seq)
        for seq in range(first_seq, first_seq + count)
    ]


def test_collector_write_thread_died_on_a_full_spool_now_keeps_every_row_until_the_disk_frees(tmp_path):
    """Regression: with the store down, a spool append raising ENOSPC killed the collector's writing
    thread for good: that batch was lost, and the rest survived only because the collector stopped
    cleanly."""
    (tmp_path / "dbroot").mkdir()
    dsn = initialised(tmp_path / "dbroot")
    with tmpfs(tmp_path / "spool", "1m") as spool_dir, read_only(tmp_path / "dbroot") as writable:
        ballast = fill(spool_dir)
        collector = collector_of(dsn, spool_dir, flush_interval=0.2).start()
        try:
            send(collector.address, *burst(0, 5))
            assert wait_for(lambda: collector.write_health().rows_at_risk >= 5 * SLOTS)
            send(collector.address, *burst(5, 5))  # after the first failed write: the thread lives on
            assert wait_for(lambda: collector.write_health().rows_at_risk >= 10 * SLOTS)
            health = collector.write_health()
            assert health.state == "degraded", health
            assert "spool unwritable" in str(health.reason) and "No space left on device" in str(
                health.reason
            )
            assert health.errors["spool"] >= 2 and health.rows_lost == 0
            ballast.unlink()
            writable()
            assert wait_for(lambda: collector.write_health().state == "ok"), collector.write_health()
            assert collector.write_health().rows_at_risk == 0
        finally:
            collector.stop()
    stored = stream_rows(dsn)
    assert len(stored) == 10 * SLOTS and collector.stats.stored >= 10 * SLOTS


def test_rows_beyond_the_hold_bound_are_dropped_oldest_first_and_counted_lost(tmp_path, monkeypatch):
    monkeypatch.setenv("STETHOSCOPE_HOLD_ROWS", str(int(7.5 * SLOTS)))
    (tmp_path / "dbroot").mkdir()
    dsn = initialised(tmp_path / "dbroot")
    bursts = [burst(0, 5), burst(5, 5), burst(10, 5)]
    with tmpfs(tmp_path / "spool", "1m") as spool_dir, read_only(tmp_path / "dbroot") as writable:
        ballast = fill(spool_dir)
        # flushed here, each burst on its own, and no health rows among them
        collector = collector_of(dsn, spool_dir, flush_interval=3600, health_interval=3600).start()
        try:
            for sent, datagrams in enumerate(bursts, start=1):
                send(collector.address, *datagrams)
                assert wait_for(lambda n=sent: collector.stats.datagrams == 5 * n)
                collector.flush()
            health = collector.write_health()
            assert (health.rows_at_risk, health.rows_lost) == (int(7.5 * SLOTS), int(7.5 * SLOTS)), health
            ballast.unlink()
            writable()
            collector.flush()
            assert collector.write_health().rows_at_risk == 0
        finally:
            collector.stop()
    stored = stream_rows(dsn)
    assert len(stored) == int(7.5 * SLOTS)
    # the newest kept: half of the 3rd datagram of the second burst, the rest of it, the third burst
    assert {ts for _node, ts in stored} == {_ts(data) for data in bursts[1][2:] + bursts[2]}


def _ts(data: bytes) -> int:
    from stethoscope.telemetry import wire

    header = wire.parse_header(data)
    assert isinstance(header, wire.Header)
    return header.ts_ms


def _batch(n: int, device: str = "gpu0") -> Batch:
    metrics = MetricColumns()
    now = int(time.time() * 1000)
    for i in range(n):
        metrics.append("n1", "gpu_power_watts", device, {}, float(i), now - 60_000 + i)
    bench = [
        {
            "run_id": "r1", "node_id": "n1", "suite": "storage", "metric_name": "bench_fio_randread_iops",
            "device": "nvme0n1", "labels": {}, "value": 9.0e5, "unit": "iops", "repetition": 1,
            "class_fingerprint": "c", "node_fingerprint": "n", "unstable": 0, "timestamp": now,
        }
    ]  # fmt: skip
    return Batch(metrics=metrics, bench=bench)


def test_writer_raised_on_a_full_spool_now_returns_the_rows_it_could_not_keep(tmp_path):
    (tmp_path / "dbroot").mkdir()
    dsn = initialised(tmp_path / "dbroot")
    with tmpfs(tmp_path / "spool", "1m") as spool_dir, read_only(tmp_path / "dbroot") as writable:
        ballast = fill(spool_dir)
        writer = Writer(dsn, spool_dir, timeout=10)
        report = writer.write(_batch(300))
        assert report.error and report.stored == 0 and report.spooled == 0
        assert "No space left on device" in str(report.spool_error)
        assert (len(report.held.metrics), len(report.held.bench)) == (300, 1)
        assert not list(spool_dir.glob("*.part")), "a failed append left a file behind"
        ballast.unlink()
        writable()
        again = writer.write(report.held)
        assert again.error is None and again.stored == 301 and len(again.held) == 0
    with Store(dsn) as store:
        assert store.query("SELECT count() FROM stethoscope.metrics FINAL") == [(300,)]
        assert store.query("SELECT count() FROM stethoscope.bench_results") == [(1,)]


def test_read_only_database_folder_was_a_configuration_error_now_a_store_outage(tmp_path):
    """Regression: a database folder turned read-only was "not a database: the folder is not
    writable by this user", a configuration error (exit 2, nothing spooled) instead of an outage."""
    (tmp_path / "dbroot").mkdir()
    dsn = initialised(tmp_path / "dbroot")
    writer = Writer(dsn, tmp_path / "spool", timeout=10)
    with read_only(tmp_path / "dbroot") as writable:
        with pytest.raises(StoreError, match="read-only") as caught:
            Store(dsn).open()
        assert not isinstance(caught.value, ConfigError)
        down = writer.write(_batch(40))
        assert down.error and "read-only" in down.error and down.spooled == 41
        vanished = f"chdb://{tmp_path / 'dbroot' / 'gone' / 'db'}"  # cannot even be created now
        with pytest.raises(StoreError, match=r"gone and cannot be created now \(Read-only file system\)"):
            Store(vanished).open()
        writable()
        up = writer.write(_batch(10, device="gpu1"))
    assert up.error is None and up.stored == 11 and up.replayed == 41
    with Store(dsn) as store:
        assert store.query("SELECT count() FROM stethoscope.metrics FINAL") == [(50,)]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a database: it is a file"):  # a setting, still
        Store(f"chdb://{tmp_path / 'file'}").open()
    with pytest.raises(ConfigError, match="unsupported DSN scheme"):
        Writer("ftp://nowhere/db", tmp_path / "spool")


def test_ingest_on_a_full_spool_and_a_read_only_store_fails_saying_how_many_rows_it_could_not_keep(tmp_path):
    """ingest holds nothing past its exit: rows neither stored nor spooled are a failed run, counted."""
    from test_cli import cli

    (tmp_path / "dbroot").mkdir()
    dsn = initialised(tmp_path / "dbroot")
    row = {"node_id": "n1", "metric_name": "gpu_temperature_celsius", "device": "gpu0", "labels": {}}
    now = int(time.time())
    lines = [json.dumps({**row, "value": 40 + i, "timestamp": now - 60 + i}) for i in range(25)]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    with tmpfs(tmp_path / "spool", "1m") as spool_dir, read_only(tmp_path / "dbroot"):
        fill(spool_dir)
        result = cli("--dsn", dsn, "--spool-dir", str(spool_dir), "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 3, result.stderr
    assert "25 rows neither stored nor spooled: spool unwritable: [Errno 28] No space left" in result.stderr
    assert "read-only" in result.stderr and "Traceback" not in result.stderr


def test_serve_said_ok_while_its_writer_was_dead_now_degraded_until_every_row_is_stored(tmp_path):
    """Regression: on a full disk the collector's writing thread died, /healthz said ok and the rows
    sent were never stored."""
    with tmpfs(tmp_path / "disk", "64m") as disk:
        dsn = f"chdb://{disk / 'db'}"
        secret_file = tmp_path / "cluster.secret"
        secret_file.write_bytes(SERVE_SECRET + b"\n")
        proc, udp, http = _start_serve(disk, dsn, secret_file)
        try:
            assert wait_for(lambda: json.loads(_get(f"{http}/healthz")[1])["cycles"] >= 1, 60)
            ballast = fill(disk)
            sent = _send_node_part(udp, 20, 1000, lambda seq, slots: [float(i + seq) for i in range(slots)])

            def degraded() -> tuple[int, dict] | None:
                status, body = _get(f"{http}/healthz")
                health = json.loads(body)
                return (status, health) if health["collector"]["rows_at_risk"] >= sent else None

            seen = wait_for(degraded)
            assert seen, _get(f"{http}/healthz")
            status, health = seen
            assert status == 200 and health["status"] == "degraded", health  # alive: never restart it
            assert health["collector"]["write_state"] == "degraded"
            assert "No space left on device" in health["collector"]["write_problem"]
            metrics = _get(f"{http}/metrics")[1]
            at_risk = re.search(r"^stethoscope_telemetry_rows_at_risk ([\d.e+]+)$", metrics, re.MULTILINE)
            assert at_risk and float(at_risk[1]) >= sent, metrics
            assert re.search(
                r'^stethoscope_telemetry_write_errors_total\{kind="spool"\} [1-9]', metrics, re.M
            )
            assert "stethoscope_telemetry_rows_lost_total 0.0" in metrics
            ballast.unlink()

            def recovered() -> dict | None:
                health = json.loads(_get(f"{http}/healthz")[1])
                return health if health["status"] == "ok" else None

            health = wait_for(recovered)
            assert health and health["status"] == "ok" and health["collector"]["rows_at_risk"] == 0
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        with Store(dsn) as store:
            stored = store.query(
                "SELECT count(), uniqExact(node_id, metric_name, timestamp) FROM stethoscope.metrics "
                "WHERE labels['source'] = 'stream'"
            )[0]
    assert stored == (sent, sent)


def _outage_playbook(tmp_path: Path, ballast: Path, dbroot: Path, tasks: int, rows: int) -> Path:
    """Localhost returns rows in `tasks` results while the outage lasts; a last task ends it."""
    hand_over = [
        {
            "name": f"Hand over rows {task}",
            "ansible.builtin.debug": {"var": "stethoscope_metrics"},
            "vars": {
                "stethoscope_metrics": [
                    {
                        "name": "gpu_power_watts",
                        "device": f"gpu{task}",
                        "value": float(i),
                        "labels": {"i": str(i)},
                    }
                    for i in range(rows)
                ]
            },
        }
        for task in range(tasks)
    ]
    recover = [
        {"name": "Free the spool's disk", "ansible.builtin.file": {"path": str(ballast), "state": "absent"}},
        {
            "name": "Make the database folder writable again",
            "ansible.builtin.command": {"argv": ["mount", "-o", "remount,rw,bind", str(dbroot)]},
            "changed_when": True,
        },
    ]
    play = [{"name": "Outage", "hosts": "localhost", "gather_facts": False, "tasks": hand_over + recover}]
    path = tmp_path / "outage.yml"
    path.write_text(json.dumps(play))
    return path


def test_callback_lost_rows_on_a_read_only_store_and_a_full_spool_now_stores_them_at_play_end(tmp_path):
    """Regression: a read-only database folder was a configuration error to the callback, and the
    rows it then tried to keep in rejected/ found the spool's disk full: all lost."""
    (tmp_path / "dbroot").mkdir()
    dsn = initialised(tmp_path / "dbroot")
    with tmpfs(tmp_path / "spool", "1m") as spool_dir, read_only(tmp_path / "dbroot"):
        ballast = fill(spool_dir)
        playbook = _outage_playbook(tmp_path, ballast, tmp_path / "dbroot", tasks=3, rows=10)
        env = ansible_env(
            tmp_path,
            dsn,
            ANSIBLE_CALLBACKS_ENABLED="aicluster.stethoscope.clickhouse",
            STETHOSCOPE_BATCH_SIZE="1",
            STETHOSCOPE_WRITE_TIMEOUT="10",
        )
        run = subprocess.run(
            [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert not ballast.exists()
    output = " ".join((run.stdout + run.stderr).split())
    assert output.count("kept in memory") == 1, output[-3000:]  # warned once, not per flush
    assert "No space left on device" in output
    with Store(dsn) as store:
        stored = store.query(
            "SELECT device, count() FROM stethoscope.metrics FINAL "
            "WHERE metric_name = 'gpu_power_watts' GROUP BY device ORDER BY device"
        )
    assert stored == [("gpu0", 10), ("gpu1", 10), ("gpu2", 10)]
