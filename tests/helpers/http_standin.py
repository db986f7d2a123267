"""Real HTTP servers on loopback standing in for Jira and webhooks: they record every request (method,
path, headers, body) and answer like the real thing, optionally failing the first N requests."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)  # when it arrived

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class StandIn:
    fail_first: int = 0  # answer 503 to this many requests first
    retry_after: str | None = None  # the Retry-After header of those 503s
    slow_paths: dict[str, float] = field(default_factory=dict)  # path -> seconds it waits before answering
    requests: list[Request] = field(default_factory=list)
    issues: dict[str, dict] = field(default_factory=dict)  # the Jira stand-in's issues by key
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # requests arrive in parallel

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def answer(self, request: Request) -> tuple[int, Any]:
        if self.fail_first > 0:
            self.fail_first -= 1
            return 503, {"error": "try again"}
        path = request.path.split("?", 1)[0]
        if path == "/rest/api/2/search":
            label = request.path.split("stethoscope-", 1)[-1].split("%22", 1)[0].split('"', 1)[0]
            found = [
                {"key": k} for k, issue in self.issues.items() if f"stethoscope-{label}" in issue["labels"]
            ]
            return 200, {"total": len(found), "issues": found}
        if path == "/rest/api/2/issue" and request.method == "POST":
            key = f"OPS-{len(self.issues) + 1}"
            self.issues[key] = {**request.json()["fields"], "attachments": []}
            return 201, {"id": str(len(self.issues)), "key": key}
        if path.startswith("/rest/api/2/issue/") and path.endswith("/attachments"):
            key = path.split("/")[5]
            self.issues[key]["attachments"].append(request.body)
            return 200, [{"filename": "attachment"}]
        return 200, {"ok": True}

    def start(self) -> StandIn:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                request = Request(
                    self.command, self.path, dict(self.headers.items()), self.rfile.read(length)
                )
                time.sleep(standin.slow_paths.get(self.path, 0.0))
                with standin.lock:
                    standin.requests.append(request)
                    status, body = standin.answer(request)
                data = json.dumps(body).encode()
                self.send_response(status)
                if status == 503 and standin.retry_after is not None:
                    self.send_header("Retry-After", standin.retry_after)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
