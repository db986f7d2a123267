"""The stethoscope command: exit codes, messages naming file and line, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import TOP


def cli(*args, env_extra=None, cwd=TOP):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
    )


def test_db_init_and_ingest(tmp_path):
    dsn = f"chdb://{tmp_path / 'db'}"
    good = {
        "node_id": "n1",
        "metric_name": "gpu_temperature_celsius",
        "device": "gpu0",
        "labels": {},
        "value": 41,
        "timestamp": "2026-11-30T00:00:00Z",
    }
    lines = [
        json.dumps(good),
        json.dumps({**good, "metric_name": "gpu_made_up"}),
        "{not json",
        json.dumps({**good, "timestamp": 1764460860, "value": 42}),
    ]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    spool = str(tmp_path / "spool")
    assert cli("--dsn", dsn, "--spool-dir", spool, "db", "init").returncode == 0
    result = cli("--dsn", dsn, "--spool-dir", spool, "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 2
    assert "rows.ndjson:2: unknown metric 'gpu_made_up'" in result.stderr
    assert "rows.ndjson:3: not JSON" in result.stderr
    assert "stored 2 rows" in result.stdout and "Traceback" not in result.stderr
    summary = cli("--dsn", dsn, "summary")
    assert summary.returncode == 0 and "n1" in summary.stdout


def test_ingest_with_the_database_down_spools_without_leaking_the_password(tmp_path):
    (tmp_path / "rows.ndjson").write_text(
        json.dumps(
            {
                "node_id": "n1",
                "metric_name": "net_mtu",
                "device": "ib0",
                "value": 4096,
                "timestamp": 1764460800,
            }
        )
        + "\n"
    )
    result = cli(
        "--spool-dir",
        str(tmp_path / "spool"),
        "ingest",
        str(tmp_path / "rows.ndjson"),
        env_extra={"STETHOSCOPE_DSN": "http://admin:hunter2@127.0.0.1:9/x"},
    )
    assert result.returncode == 0, result.stderr
    assert "1 rows spooled" in result.stderr and "hunter2" not in result.stderr + result.stdout
    status = cli("--spool-dir", str(tmp_path / "spool"), "spool", "status")
    assert status.stdout.startswith("1 rows waiting")


def test_missing_file_and_bad_dsn_are_usage_errors(tmp_path):
    assert cli("ingest", str(tmp_path / "nope.ndjson")).returncode == 2
    bad = cli("--dsn", "ftp://x", "db", "init")
    assert bad.returncode == 2 and "unsupported DSN scheme" in bad.stderr


def test_cluster_ddl_printed():
    result = cli("db", "ddl", "--cluster", "gpu")
    assert result.returncode == 0 and "ON CLUSTER 'gpu'" in result.stdout
