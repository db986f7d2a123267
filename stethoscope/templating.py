"""Action templates render in Jinja2's sandbox; an undefined name is an error, not an empty string
(an endpoint with a hole in it must not be called).

A rendering is bounded, so that one template never stops a diagnosis cycle: it runs in a process of
its own (stethoscope.render_worker) whose memory is capped, whose output is capped at OUTPUT_CHARS,
and which is killed (and started again for the next rendering) at RENDER_SECONDS. Any error in it (a
division by a zero value, `int` of an infinite one, nested loops, a string of gigabytes) is a
TemplateFailure for that template only. A worker, not checks inside the sandbox: Jinja2 and Python
offer more ways to make a large value or a long loop than any list of checks would hold.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading
from typing import IO, Any

RENDER_SECONDS = 1.0
OUTPUT_CHARS = 64 * 1024


class TemplateFailure(ValueError):
    pass


class Undefined(TemplateFailure):
    """The template names a variable nothing defines (a setting not configured)."""


class _Worker:
    """One rendering process, used by one thread at a time, started when first needed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None

    def render(self, template: str, context: dict[str, Any], seconds: float) -> dict[str, str]:
        request = json.dumps(
            {"template": template, "context": context, "output_chars": OUTPUT_CHARS}, default=str
        )
        with self._lock:
            process = self._started()
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(request + "\n")
                process.stdin.flush()
                if not _readable(process.stdout, seconds):
                    self._stop()
                    return {"failed": f"ran past {seconds:g} s"}
                line = process.stdout.readline()
            except OSError as exc:
                self._stop()
                return {"failed": f"the renderer failed ({exc})"}
            if not line:
                self._stop()
                return {"failed": "the renderer died (past its memory bound?)"}
            answer: dict[str, str] = json.loads(line)
            return answer

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "stethoscope.render_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                encoding="utf-8",
            )
        return self._process

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


def _readable(stream: IO[str], seconds: float) -> bool:
    poller = select.poll()  # not select(): serve's descriptors (the store's files) pass 1024
    poller.register(stream, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


_WORKER = _Worker()


def render(template: str, context: dict[str, Any], seconds: float = RENDER_SECONDS) -> str:
    answer = _WORKER.render(template, context, seconds)
    if "ok" in answer:
        return answer["ok"]
    if "undefined" in answer:
        raise Undefined(f"template {_shown(template)}: {answer['undefined']}")
    raise TemplateFailure(f"template {_shown(template)}: {answer['failed']}")


def _shown(template: str) -> str:
    return repr(template if len(template) <= 200 else template[:197] + "...")
