"""Waiting for a busy embedded database: the writer honours STETHOSCOPE_OPEN_WAIT like every
other open, within half its write timeout (a write never outlasts its timeout), and the holder is
named while a stethoscope process holds the database, even after a second handle of that process (a
collector's writer, each second) opened and closed it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.writer import Writer

from conftest import TOP, database_held_elsewhere

NOW_MS = time.time_ns() // 1_000_000 - 60_000


def batch() -> Batch:
    rows = MetricColumns()
    rows.append("n1", "gpu_power_watts", "gpu0", {}, 1.0, NOW_MS)
    return Batch(metrics=rows)


def test_the_writer_spools_at_once_with_open_wait_0(tmp_path, monkeypatch):
    """Regression: the writer waited half its timeout whatever STETHOSCOPE_OPEN_WAIT said."""
    monkeypatch.setenv("STETHOSCOPE_OPEN_WAIT", "0")
    with database_held_elsewhere(tmp_path / "db"):
        started = time.monotonic()
        report = Writer(f"chdb://{tmp_path / 'db'}", tmp_path / "spool").write(batch())
        took = time.monotonic() - started
    assert report.spooled == 1 and "in use by another process" in (report.error or "")
    assert took < 3, took


def test_the_writer_waits_as_long_as_open_wait_says_within_half_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("STETHOSCOPE_OPEN_WAIT", "30")
    with database_held_elsewhere(tmp_path / "db", seconds=6):
        report = Writer(f"chdb://{tmp_path / 'db'}", tmp_path / "spool", timeout=30).write(batch())
    assert report.error is None and report.stored == 1, report


def test_open_wait_never_stretches_a_write_past_its_timeout(tmp_path, monkeypatch):
    """Regression: with STETHOSCOPE_OPEN_WAIT=30 a callback whose timeout is 10 s blocked ~35 s per
    flush: a sink that hangs must not stall the play. The writer waits min(open wait, timeout / 2)."""
    monkeypatch.setenv("STETHOSCOPE_OPEN_WAIT", "30")
    with database_held_elsewhere(tmp_path / "db"):
        started = time.monotonic()
        report = Writer(f"chdb://{tmp_path / 'db'}", tmp_path / "spool", timeout=4).write(batch())
        took = time.monotonic() - started
    assert report.spooled == 1 and "in use by another process" in (report.error or ""), report
    assert took < 6, took


def test_a_stethoscope_holder_is_named_after_its_writer_closed_a_second_handle(tmp_path):
    """Regression: "held by another process (it left no holder file...)" while the holder was a
    stethoscope collector: its writer's own open and close of the database had removed the file."""
    dsn = f"chdb://{tmp_path / 'db'}"
    inventory, secret = tmp_path / "hosts.yml", tmp_path / "cluster.secret"
    inventory.write_text("---\nall:\n  hosts:\n    node01: {stethoscope_node_key: 1}\n")
    secret.write_bytes(b"holder-test-secret-0123456789\n")
    cli = [sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "--spool-dir", str(tmp_path / "spool")]
    collector = subprocess.Popen(
        [*cli, "collector", "--inventory", str(inventory), "--secret-file", str(secret), "--listen",
         "127.0.0.1:0", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP,
    )  # fmt: skip
    try:
        assert collector.stdout is not None
        assert collector.stdout.readline().startswith("collector on udp")
        time.sleep(7)  # its writer has stored the collector's health rows through a handle of its own
        env = {**os.environ, "STETHOSCOPE_OPEN_WAIT": "1"}
        summary = subprocess.run([*cli, "summary"], capture_output=True, text=True, cwd=TOP, env=env)
    finally:
        collector.terminate()
        collector.wait(timeout=60)
    assert summary.returncode == 3, summary.stderr
    assert f"pid {collector.pid} (stethoscope collector, since " in summary.stderr, summary.stderr
    assert "no holder file" not in summary.stderr
