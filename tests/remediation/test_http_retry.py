"""HTTP actions retry through urllib3: Retry-After is honoured, the idempotency key rides on every
try, a connection refused is retried and reported without the URL's credentials."""

from __future__ import annotations

import socket

from stethoscope.remediation.actions.http import send


def test_retry_after_is_honoured_and_the_idempotency_key_is_on_every_try(http_standin):
    api = http_standin(fail_first=1, retry_after="1")
    result = send(f"{api.url}/ticket", b'{"n": 1}', idempotency_key="txn0001", retries=3, backoff=0.01)
    assert (result.ok, result.status, result.attempts) == (True, 200, 2)
    first, second = api.requests
    assert first.headers["Idempotency-Key"] == second.headers["Idempotency-Key"] == "txn0001"
    assert second.at - first.at >= 1.0  # the server asked for 1 s; the backoff alone would be 10 ms
    assert second.json() == {"n": 1}


def test_a_refused_connection_is_retried_and_reported_without_credentials():
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = send(
        f"http://bot:s3cret-token@127.0.0.1:{port}/hook", b"{}", idempotency_key="t", retries=2, backoff=0.01
    )
    assert (result.ok, result.status, result.attempts) == (False, None, 3)
    assert "s3cret-token" not in result.detail and "Connection" in result.detail
