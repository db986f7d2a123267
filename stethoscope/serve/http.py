"""serve's HTTP endpoint: /healthz, /metrics (Prometheus text format), /report (the last board). A
client that is slow to send its request is timed out; an address already in use is a configuration
error that names itself (exit 2)."""

from __future__ import annotations

import json
import logging
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stethoscope.store.dsn import ConfigError

log = logging.getLogger(__name__)
NODE_PAGE = re.compile(r"/report/nodes/[A-Za-z0-9._-]+\.html")
CLIENT_TIMEOUT = 10.0  # seconds a client may take to send its request line and headers


def bind(address: tuple[str, int], handler_class: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    try:
        server = ThreadingHTTPServer(address, handler_class)
    except OSError as exc:
        raise ConfigError(f"--http {address[0]}:{address[1]}: cannot listen there: {exc.strerror}") from None
    server.daemon_threads = True
    return server


def handler(server: Any) -> type[BaseHTTPRequestHandler]:
    """A handler class answering for `server` (serve.server.Server: health, metrics, page)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CLIENT_TIMEOUT

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                status, body = server.health()
                self._send(status, "application/json", json.dumps(body).encode())
            elif path == "/metrics":
                self._send(200, "text/plain; version=0.0.4; charset=utf-8", server.metrics())
            elif path in ("/report", "/report/") or NODE_PAGE.fullmatch(path):
                page = server.page(path.removeprefix("/report").strip("/") or "index.html")
                if page is None:
                    self._send(503, "text/plain", b"no board yet: the first cycle has not finished\n")
                else:
                    self._send(200, "text/html; charset=utf-8", page)
            else:
                self._send(404, "text/plain", b"not found: /healthz, /metrics, /report\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("serve: http: " + format, *args)

    return Handler
