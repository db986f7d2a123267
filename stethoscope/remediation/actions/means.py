"""What an action handler is given (remediation.actions.registry): the executor's means, and the one
action to run for one finding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.context import Context

# (status, target, detail): how it went (ok, failed, skipped, refused), where it went, what it said
Result = tuple[str, str, Any]


class Means(Protocol):
    """The executor as its handlers use it: its context, breaker and settings."""

    ctx: Context
    breaker: CircuitBreaker
    http_timeout: float
    http_retries: int
    playbook_timeout: int
    log_path: Path


@dataclass(frozen=True)
class Act:
    """One action for one finding: its parameters as the rule gives them, the finding's template
    context, and whether its earlier attempt was refused (by the circuit breaker: alerted then)."""

    finding: dict[str, Any]
    params: dict[str, Any]
    context: dict[str, Any]
    refused_before: bool = False
