"""Secrets in a DSN: a password may hold any character (percent-encoded, or a raw `@`: the
last `@` before the host ends the user info) and reaches the server intact; it is masked whole in
every message; `?password=` works, and a password given twice is exit 2 with nothing spooled."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import pytest

from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import ConfigError, redact, resolve_dsn, target_of

from conftest import TOP


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", *args],
        capture_output=True,
        text=True,
        cwd=TOP,
        env=dict(os.environ),
    )


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        ("http://admin:p@ss@db:8123/x failed", "http://admin:***@db:8123/x failed"),
        ("https://admin:a@b@c:d@db/x", "https://admin:***@db/x"),
        ("http://ops@corp:hunter2@db:8123/x", "http://ops@corp:***@db:8123/x"),
        ("http://admin:p%40ss%2Fw@db/x", "http://admin:***@db/x"),
        ("http://:hunter2@db/x", "http://:***@db/x"),
    ],
)
def test_the_whole_password_is_masked_whatever_it_holds(dsn, masked):
    """Regression: with a raw `@` in the password, the part after it was printed."""
    assert redact(dsn) == masked


def test_a_raw_at_in_the_password_never_reaches_a_message(tmp_path):
    result = cli("--dsn", "http://admin:hun@ter2@127.0.0.1:9/x", "summary")
    assert result.returncode == 3, result.stderr
    assert "ter2" not in result.stderr and "hun" not in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(StoreError) as caught:
        Store("http://admin:s3c@r:et@127.0.0.1:1/x", timeout=2).open().query("SELECT 1")
    assert "s3c" not in str(caught.value) and "r:et" not in str(caught.value)


def _credentials(standin) -> tuple[str, str]:
    (first, *_) = standin.requests
    user, _, password = base64.b64decode(first.headers["Authorization"].split()[1]).decode().partition(":")
    return user, password


@pytest.mark.parametrize(
    ("userinfo", "query", "user", "password"),
    [
        ("admin:p@ss", "", "admin", "p@ss"),
        ("admin:a:b@c", "", "admin", "a:b@c"),
        ("admin:%2Fsl%3Fash%23%25", "", "admin", "/sl?ash#%"),
        ("admin", "?password=p%40ss%26x", "admin", "p@ss&x"),
        ("", "?user=ops&password=hunter2", "ops", "hunter2"),
    ],
)
def test_every_password_reaches_the_server_intact(http_standin, userinfo, query, user, password):
    """Regression: a `?password=` DSN always failed ("multiple values for argument 'password'")."""
    server = http_standin()
    host = server.url.removeprefix("http://")
    dsn = f"http://{userinfo}@{host}/x{query}" if userinfo else f"http://{host}/x{query}"
    with pytest.raises(StoreError) as caught:  # the stand-in is no ClickHouse: what matters is what it got
        Store(dsn, timeout=3).open().query("SELECT 1")
    assert _credentials(server) == (user, password)
    assert password not in str(caught.value)
    assert password not in target_of(resolve_dsn(dsn))


def test_a_password_given_twice_is_exit_2_and_nothing_is_spooled(tmp_path):
    with pytest.raises(ConfigError, match="password"):
        resolve_dsn("http://admin:hunter2@127.0.0.1:9/x?password=hunter3")
    (tmp_path / "rows.ndjson").write_text(
        '{"node_id": "n1", "metric_name": "gpu_power_watts", "device": "gpu0", "value": 1, "timestamp": 1}\n'
    )
    spool = tmp_path / "spool"
    for dsn in (
        "http://admin:hunter2@127.0.0.1:9/x?password=hunter3",
        "http://admin:hunter2@127.0.0.1:9/x?username=other",
    ):
        result = cli("--dsn", dsn, "--spool-dir", str(spool), "ingest", str(tmp_path / "rows.ndjson"))
        assert result.returncode == 2, result.stderr
        assert "hunter2" not in result.stderr and "hunter3" not in result.stderr
        assert "Traceback" not in result.stderr
        assert not spool.exists() or not any(spool.rglob("*.ndjson"))
