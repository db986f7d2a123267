"""HTTP for alerts and api_call actions: a timeout on every attempt, retries with backoff on
connection errors, 429 and 5xx, and the transaction id as idempotency key on every attempt, so a
retried call is recognisable as the same call."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from urllib.parse import urlsplit

RETRYABLE = {429, 500, 502, 503, 504}


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
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        return HttpResult(False, None, 0, f"not an http(s) URL: {url!r}")
    detail = ""
    status: int | None = None
    for attempt in range(1, retries + 2):
        request = urllib.request.Request(url, data=body, method=method)
        request.add_header("Idempotency-Key", idempotency_key)
        if body is not None:
            request.add_header("Content-Type", content_type)
        for key, value in (headers or {}).items():
            request.add_header(key, value)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return HttpResult(
                    True, response.status, attempt, response.read(2000).decode("utf-8", "replace")
                )
        except urllib.error.HTTPError as exc:
            status, detail = exc.code, f"HTTP {exc.code} {exc.reason}"
            if exc.code not in RETRYABLE:
                return HttpResult(False, status, attempt, detail)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            status, detail = None, f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        if attempt <= retries:
            time.sleep(backoff * 2 ** (attempt - 1))
    return HttpResult(False, status, retries + 1, detail)
