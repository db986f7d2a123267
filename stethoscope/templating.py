"""Action templates render in Jinja2's sandbox; an undefined name is an error, not an empty string
(an endpoint with a hole in it must not be called)."""

from __future__ import annotations

from typing import Any

from jinja2 import StrictUndefined, TemplateError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

_SANDBOX = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


class TemplateFailure(ValueError):
    pass


class Undefined(TemplateFailure):
    """The template names a variable nothing defines (a setting not configured)."""


def render(template: str, context: dict[str, Any]) -> str:
    try:
        return _SANDBOX.from_string(template).render(**context)
    except UndefinedError as exc:
        raise Undefined(f"template {template!r}: {exc}") from None
    except TemplateError as exc:
        raise TemplateFailure(f"template {template!r}: {exc}") from None
