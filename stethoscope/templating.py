"""Action templates render in Jinja2's sandbox; an undefined name is an error, not an empty string
(an endpoint with a hole in it must not be called)."""

from __future__ import annotations

from typing import Any

from jinja2 import StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

_SANDBOX = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


class TemplateFailure(ValueError):
    pass


def render(template: str, context: dict[str, Any]) -> str:
    try:
        return _SANDBOX.from_string(template).render(**context)
    except TemplateError as exc:
        raise TemplateFailure(f"template {template!r}: {exc}") from None
