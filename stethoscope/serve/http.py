"""serve's HTTP endpoint: /healthz, /metrics (Prometheus text format, OpenMetrics when asked, gzip when
accepted: serve.exposition), /report (the last board),
/gate/<node> (the node's signed verdict for its Slurm gate). With --gate-listen a second endpoint
answers GET /gate/<node> only, for the nodes to reach: the verdicts are signed, the board and the
metrics stay on the loopback one (which answers /gate too, for a gate on the controller). A client
that is slow to send its request is cut off: each read has a timeout, and the whole request a
deadline (a client trickling a header line every few seconds would pass every read's timeout). An
address already in use is a configuration error that names itself (exit 2). HEAD answers what GET
would, without the body."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stethoscope.store.dsn import ConfigError

log = logging.getLogger(__name__)
NODE_PAGE = re.compile(r"/report/nodes/[A-Za-z0-9._-]+\.html")
GATE_PATH = re.compile(r"/gate/([A-Za-z0-9._-]+)")  # a node's signed verdict (serve.verdicts)
CLIENT_TIMEOUT = 10.0  # seconds each read of a client's request may wait
REQUEST_DEADLINE = 10.0  # seconds from connecting to the end of the headers, all reads together


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # connections the kernel holds until they are accepted (the default, 5, dropped the 7th of a
    # burst for a second: a burst of clients slow to send delayed every other one)
    request_queue_size = 128


def bind(
    address: tuple[str, int], handler_class: type[BaseHTTPRequestHandler], flag: str = "--http"
) -> ThreadingHTTPServer:
    try:
        return _Server(address, handler_class)
    except OSError as exc:
        raise ConfigError(f"{flag} {address[0]}:{address[1]}: cannot listen there: {exc.strerror}") from None


class Deadline:
    """Shuts a connection down when its client has not sent a whole request in time: a read blocked
    on it returns at once, and nothing is answered. `stop` when the request is in."""

    def __init__(self, connection: socket.socket, seconds: float) -> None:
        self.connection = connection
        self.passed = False
        self._stopped = False
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._cut_off)
        self._timer.daemon = True
        self._timer.start()

    def _cut_off(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.passed = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def stop(self) -> bool:
        """Stop the clock: False when the deadline had already passed (answer nothing)."""
        self._timer.cancel()
        with self._lock:
            self._stopped = True
            return not self.passed


def handler(server: Any, gate_only: bool = False) -> type[BaseHTTPRequestHandler]:
    """A handler class answering for `server` (serve.server.Server: health, metrics, page, gate);
    `gate_only`: /gate/<node> and nothing else (--gate-listen)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = CLIENT_TIMEOUT
        deadline: Deadline
        head_only = False

        def setup(self) -> None:
            super().setup()
            self.deadline = Deadline(self.connection, REQUEST_DEADLINE)

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:
                if not self.deadline.passed:
                    raise
                log.debug(
                    "serve: http: %s cut off: no whole request in %g s", self.client_address, REQUEST_DEADLINE
                )

        def finish(self) -> None:
            self.deadline.stop()
            super().finish()

        def do_HEAD(self) -> None:
            self.head_only = True
            self.do_GET()

        def do_GET(self) -> None:
            if not self.deadline.stop():
                return
            path = self.path.split("?", 1)[0]
            if gate_only:
                if gate := GATE_PATH.fullmatch(path):
                    status, body = server.gate(gate[1])
                    self._send(status, "application/json" if status == 200 else "text/plain", body)
                else:
                    self._send(404, "text/plain", b"not found: /gate/NODE only\n")
            elif path == "/healthz":
                status, body = server.health()
                self._send(status, "application/json", json.dumps(body).encode())
            elif path == "/metrics":
                scrape = server.metrics(self.headers.get("Accept"), self.headers.get("Accept-Encoding"))
                extra = {"Vary": "Accept, Accept-Encoding"}
                if scrape.encoding:
                    extra["Content-Encoding"] = scrape.encoding
                self._send(200, scrape.content_type, scrape.body, extra)
            elif path in ("/report", "/report/") or NODE_PAGE.fullmatch(path):
                page = server.page(path.removeprefix("/report").strip("/") or "index.html")
                if page is None:
                    self._send(503, "text/plain", b"no board yet: the first cycle has not finished\n")
                else:
                    self._send(200, "text/html; charset=utf-8", page)
            elif gate := GATE_PATH.fullmatch(path):
                status, body = server.gate(gate[1])
                kind = "application/json" if status == 200 else "text/plain"
                self._send(status, kind, body)
            else:
                self._send(404, "text/plain", b"not found: /healthz, /metrics, /report, /gate/NODE\n")

        def _send(
            self, status: int, content_type: str, body: bytes, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            if not self.head_only:
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("serve: http: " + format, *args)

    return Handler
