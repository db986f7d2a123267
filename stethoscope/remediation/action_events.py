"""What the executor did, as it happens: one `logging` record per finished action (logger
`stethoscope.actions`), carrying an `ActionEvent`, and the breaker's last armed state. `diagnose`,
`watch` and `serve` print the records to stderr (`print_actions`: text, or JSON under serve's
`--log-format json`); serve's /metrics counts them (`ActionCounts`) by action and outcome, every
combination from the start at 0.

Outcomes: `ok` (taken), `failed`, `refused` (by the circuit breaker), `skipped` (nothing configured
to act with), `expired` (an in-flight action whose executor died), `needs_person` (past its last
retry: a person is asked)."""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any, TextIO

from stethoscope.terminal import terminal_safe

LOGGER = logging.getLogger("stethoscope.actions")
OUTCOMES = ("ok", "failed", "refused", "skipped", "expired", "needs_person")
# the short names of the shipped actions (diagnosis.levels.action_label, remediate/*.yml shortened);
# another playbook is counted as `playbook`
ACTIONS = ("log", "alert", "api_call", "drain", "evidence", "ticket", "verify", "rebaseline", "playbook")
_SHIPPED = re.compile(r"playbook:remediate/(\w+)\.yml")
# the ticket role says which issue holds the finding: "opened KEY" or "already filed as KEY"
_TICKET_KEY = re.compile(r"(?:opened|already filed as) ([A-Za-z][A-Za-z0-9_]*-\d+)")


def short_action(label: str) -> str:
    """`playbook:remediate/drain.yml` -> `drain`; `log`, `alert`, `api_call` as they are."""
    shipped = _SHIPPED.fullmatch(label)
    if shipped and shipped.group(1) in ACTIONS:
        return shipped.group(1)
    return label if label in ACTIONS else label.split(":")[0]


def ticket_key(detail: Any) -> str:
    """The issue key the ticket playbook reported, from its recorded events; "" if none."""
    for event in (detail.get("events") or []) if isinstance(detail, dict) else []:
        found = _TICKET_KEY.search(str(event.get("msg") or ""))
        if found:
            return found.group(1)
    return ""


@dataclass(frozen=True)
class ActionEvent:
    action: str  # its label, as the actions table has it
    outcome: str  # one of OUTCOMES
    node: str
    rule: str
    txn: str
    why: str = ""  # the reason of a failure, refusal or skip
    ticket: str = ""
    attempt: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"event": "action", **{k: v for k, v in asdict(self).items() if v not in ("", None)}}

    def text(self) -> str:
        rule = f" rule {self.rule}" if self.rule else ""  # a verify, an expired drain: the incident's
        head = f"action {self.action} {self.outcome}: node {self.node}{rule} txn {self.txn}"
        extra = [f"attempt {self.attempt}"] if self.attempt > 1 else []
        extra += [f"ticket {self.ticket}"] if self.ticket else []
        extra += [self.why] if self.why else []
        # the node's, the playbook's and Slurm's text: shown as written, never as terminal controls
        return terminal_safe(head + "".join(f"; {part}" for part in extra))


def emit(event: ActionEvent) -> None:
    LOGGER.info("%s", event.text(), extra={"action_event": event})


class _Printer(logging.Handler):
    def __init__(self, log_format: str, stream: TextIO | None):
        super().__init__()
        self.log_format, self.stream = log_format, stream

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "action_event", None)
        if not isinstance(event, ActionEvent):
            return
        line = json.dumps(event.to_json(), sort_keys=True) if self.log_format == "json" else event.text()
        stream = self.stream or sys.stderr
        prefix = "" if self.log_format == "json" else "stethoscope: "
        print(prefix + line, file=stream, flush=True)


def print_actions(log_format: str = "text", stream: TextIO | None = None) -> None:
    """Print every action's record to `stream` (stderr), once per process whatever calls it."""
    for handler in LOGGER.handlers:
        if isinstance(handler, _Printer):
            handler.log_format = log_format
            return
    LOGGER.addHandler(_Printer(log_format, stream))
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False


class ActionCounts(logging.Handler):
    """Actions finished since this process started, by (short action, outcome), every pair at 0 first."""

    def __init__(self) -> None:
        super().__init__()
        self.counts = {(action, outcome): 0 for action in ACTIONS for outcome in OUTCOMES}
        self._guard = threading.Lock()
        LOGGER.addHandler(self)
        LOGGER.setLevel(logging.INFO)
        LOGGER.propagate = False  # printed by print_actions' handler alone

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "action_event", None)
        if isinstance(event, ActionEvent):
            key = (short_action(event.action), event.outcome)
            with self._guard:
                self.counts[key] = self.counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._guard:
            return dict(self.counts)


_breaker: dict[str, Any] = {}
_breaker_guard = threading.Lock()  # the cycle's thread publishes, serve's HTTP thread reads


def publish_breaker(state: dict[str, Any]) -> None:
    """The breaker's state as the executor last armed it (serve's gauges read it)."""
    global _breaker
    with _breaker_guard:
        _breaker = dict(state)  # swapped whole: a reader never sees it half written


def last_breaker() -> dict[str, Any]:
    with _breaker_guard:
        return dict(_breaker)
