"""HTTP for alerts and api_call actions through urllib3: a timeout on every attempt, retries with
exponential backoff and jitter on connection errors, 429 and 5xx, honouring Retry-After, and the
transaction id as idempotency key on every attempt, so a retried call is recognisable as the same
call. Credentials (URL user info, headers) never reach the detail."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from urllib3.util.retry import Retry

from stethoscope.store.dsn import redact

RETRYABLE = (429, 500, 502, 503, 504)
MAX_BACKOFF_SECONDS = 30.0


@dataclass
class HttpResult:
    ok: bool
    status: int | None
    attempts: int
    detail: str


def send(
    url: str,
    body: bytes | None,
    *,
    method: str = "POST",
    content_type: str = "application/json",
    idempotency_key: str,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    retries: int = 3,
    backoff: float = 0.5,
) -> HttpResult:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return HttpResult(False, None, 0, f"not an http(s) URL: {redact(url)!r}")
    retry = Retry(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,
        allowed_methods=None,  # every method: the idempotency key makes a retried POST safe
        status_forcelist=RETRYABLE,
        backoff_factor=backoff,
        backoff_jitter=backoff,
        backoff_max=MAX_BACKOFF_SECONDS,
        respect_retry_after_header=True,
        raise_on_status=False,
        raise_on_redirect=False,
    )
    sent = {"Idempotency-Key": idempotency_key, **(headers or {})}
    if body is not None:
        sent["Content-Type"] = content_type
    if parts.username is not None:
        sent.update(urllib3.make_headers(basic_auth=f"{parts.username}:{parts.password or ''}"))
        url = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    with urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout), retries=retry) as pool:
        try:
            response = pool.request(method, url, body=body, headers=sent, preload_content=False)
        except urllib3.exceptions.MaxRetryError as exc:
            reason = exc.reason
            return HttpResult(False, None, retries + 1, redact(f"{type(reason).__name__}: {reason}"))
        except urllib3.exceptions.HTTPError as exc:
            return HttpResult(False, None, 1, redact(f"{type(exc).__name__}: {exc}"))
        try:
            text = response.read(2000).decode("utf-8", "replace")
        finally:
            response.release_conn()
    attempts = len(response.retries.history) + 1 if response.retries is not None else 1
    if 200 <= response.status < 400:
        return HttpResult(True, response.status, attempts, text)
    return HttpResult(
        False, response.status, attempts, f"HTTP {response.status} {response.reason or ''}".strip()
    )
