"""The executor's settings are checked when a command starts: a bad `stethoscope_action_backoff`,
`stethoscope_action_retries`, `stethoscope_incident_window` (or a breaker or executor number) is exit
2 naming the setting, for `diagnose`, `watch` and `serve --execute` alike, before any cycle runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from test_execute import db, inventory

from conftest import TOP

__all__ = ["db"]  # the fixture, shared with test_execute
SECRET = b"settings-test-secret-0123456789"


def command(tmp_path, name: str) -> list[str]:
    if name == "diagnose":
        return ["diagnose", "--no-model"]
    if name == "watch":
        return ["watch", "--no-model", "--cycles", "1", "--interval", "0.1"]
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(SECRET + b"\n")
    hosts = inventory(tmp_path)  # a node that streams: serve starts only for an inventory with one
    hosts.write_text(hosts.read_text().replace("node01: {", "node01: {stethoscope_node_key: 1, "))
    return [
        "serve", "--no-model", "--no-sweep", "--secret-file", str(secret), "--listen", "127.0.0.1:0",
        "--http", "127.0.0.1:0", "--cycles", "1", "--interval", "1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("watch", "stethoscope_action_backoff=soon"),
        ("serve", "stethoscope_incident_window=forever"),
        ("serve", "stethoscope_action_retries=many"),
        ("watch", "stethoscope_executor_parallel=four"),
        ("diagnose", "stethoscope_action_retries=-1"),
        # regression: a window that is no duration was read as an hour, a fraction of 7 as 700 %
        ("diagnose", "stethoscope_breaker_window=bogus"),
        ("diagnose", "stethoscope_breaker_fraction=7"),
        ("diagnose", "stethoscope_breaker_window_fraction=0"),
        ("diagnose", "stethoscope_breaker_isolated_fraction=-0.1"),
        ("diagnose", "stethoscope_breaker_min_isolations=0"),
        # regression: a floor above the inventory's node count disabled the limits
        ("diagnose", "stethoscope_breaker_min_isolations=100"),
        ("diagnose", "stethoscope_playbook_timeout=-5"),
        ("diagnose", "stethoscope_executor_parallel=0"),
        ("diagnose", "stethoscope_http_timeout=0"),
        ("diagnose", "stethoscope_http_retries=-1"),
        ("diagnose", "stethoscope_executor_beat=nan"),
    ],
)
def test_a_bad_executor_setting_is_exit_2_at_start_naming_it(tmp_path, db, name, setting):
    """Regression: the settings were read inside each cycle: `watch` and `serve` reported every cycle
    failed (and went on, exit 0) instead of refusing to start."""
    cli = [sys.executable, "-m", "stethoscope.cli", "--dsn", db, "--spool-dir", str(tmp_path / "spool")]
    extra = ["--execute", "--inventory", str(inventory(tmp_path)), "-e", setting]
    run = command(tmp_path, name)  # after the inventory is written: serve's gives node01 a node key
    result = subprocess.run([*cli, *run, *extra], capture_output=True, text=True, cwd=TOP, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert setting.split("=")[0] in result.stderr and "Traceback" not in result.stderr
    assert "cycle" not in result.stderr and "serve:" not in result.stdout  # no cycle ran, nothing started
