"""The action registry: each action type a rule may name (diagnosis.rules.ACTION_FIELDS) and the
handler that runs it. A handler takes the executor's means and one action for one finding and
returns (status, target, detail); the executor records it, counts it and says it."""

from __future__ import annotations

from collections.abc import Callable

from stethoscope.remediation.actions.means import Act, Means, Result
from stethoscope.remediation.actions.notify import alert, api_call, log
from stethoscope.remediation.actions.playbook_action import playbook

Handler = Callable[[Means, Act], Result]

HANDLERS: dict[str, Handler] = {
    "log": log,
    "alert": alert,
    "api_call": api_call,
    "playbook": playbook,
}


def handler(kind: str) -> Handler:
    """The handler of an action type; KeyError names the type (the rule loader refuses unknown ones)."""
    try:
        return HANDLERS[kind]
    except KeyError:
        raise KeyError(f"no handler for action type {kind!r} (known: {', '.join(HANDLERS)})") from None
