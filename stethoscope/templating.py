"""Action templates render in Jinja2's sandbox; an undefined name is an error, not an empty string
(an endpoint with a hole in it must not be called).

A rendering is also bounded, so that one template never stops a diagnosis cycle: any error inside it
(a division by a zero value, `int` of an infinite one) is a TemplateFailure, and so is a rendering
that runs past RENDER_SECONDS (nested loops), writes more than OUTPUT_CHARS, or asks for a string,
list or number too large to hold (`'x' * 10**9`, `9 ** 10**9`, `center(10**9)`). The time bound is
kept by a watchdog thread that raises RenderTimeout inside the rendering thread: the sandbox's code
is Python, so it stops at its next bytecode.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import threading
import time
from collections.abc import Callable
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

RENDER_SECONDS = 1.0
OUTPUT_CHARS = 64 * 1024
# the largest string, list or integer argument an operator or a filter may produce or take
SIZE_CAP = 100_000
_INT_BITS_CAP = 4096


class TemplateFailure(ValueError):
    pass


class Undefined(TemplateFailure):
    """The template names a variable nothing defines (a setting not configured)."""


class RenderTimeout(Exception):
    """Raised into a rendering thread at its deadline (never caught by the sandboxed template)."""


def _too_large(value: Any) -> bool:
    if isinstance(value, str | bytes | list | tuple | dict):
        return len(value) > SIZE_CAP
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() > _INT_BITS_CAP or abs(value) > SIZE_CAP * 10**300
    return False


def _product(left: Any, right: Any) -> Any:
    count = right if isinstance(left, str | list | tuple) else left
    seq = left if isinstance(left, str | list | tuple) else right
    if isinstance(seq, str | list | tuple) and isinstance(count, int) and len(seq) * count > SIZE_CAP:
        raise OverflowError(f"a sequence of {len(seq) * count} items is over the cap of {SIZE_CAP}")
    return operator.mul(left, right)


def _power(base: Any, exponent: Any) -> Any:
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 64:
        raise OverflowError(f"{base} ** {exponent} is over the cap")
    return operator.pow(base, exponent)


class _BoundedSandbox(SandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        return _product(left, right) if operator_name == "*" else _power(left, right)

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        _refuse_large_arguments(args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)


def _refuse_large_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > SIZE_CAP:
            raise OverflowError(f"an argument of {value} is over the cap of {SIZE_CAP}")


def _bounded_filter(function: Callable[..., Any]) -> Callable[..., Any]:
    """Filters are called directly, not through the sandbox's `call`: their arguments bounded here."""

    def bounded(*args: Any, **kwargs: Any) -> Any:
        _refuse_large_arguments(args[1:], kwargs)
        return function(*args, **kwargs)

    for marker in ("jinja_pass_arg",):  # @pass_context / @pass_environment stay as they were
        if hasattr(function, marker):
            setattr(bounded, marker, getattr(function, marker))
    return bounded


def _sandbox() -> _BoundedSandbox:
    sandbox = _BoundedSandbox(undefined=StrictUndefined, autoescape=False)
    sandbox.filters = {name: _bounded_filter(f) for name, f in sandbox.filters.items()}
    return sandbox


_SANDBOX = _sandbox()


class _Watchdog:
    """One daemon thread that raises RenderTimeout in a rendering thread past its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._deadlines: dict[int, float] = {}  # thread id -> monotonic deadline
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float) -> None:
        with self._lock:
            self._deadlines[threading.get_ident()] = time.monotonic() + seconds
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._watch, name="template-watchdog", daemon=True)
                self._thread.start()

    def disarm(self) -> None:
        with self._lock:
            self._deadlines.pop(threading.get_ident(), None)

    def _watch(self) -> None:
        while True:
            time.sleep(0.02)
            now = time.monotonic()
            with self._lock:  # disarm takes the lock too: no exception is raised after it returns
                for ident in [i for i, deadline in self._deadlines.items() if deadline <= now]:
                    del self._deadlines[ident]
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(
                        ctypes.c_ulong(ident), ctypes.py_object(RenderTimeout)
                    )


_WATCHDOG = _Watchdog()


def render(template: str, context: dict[str, Any], seconds: float = RENDER_SECONDS) -> str:
    try:
        return _bounded_render(template, context, seconds)
    except UndefinedError as exc:
        raise Undefined(f"template {_shown(template)}: {exc}") from None
    except TemplateError as exc:
        raise TemplateFailure(f"template {_shown(template)}: {exc}") from None
    except RenderTimeout:
        raise TemplateFailure(f"template {_shown(template)}: ran past {seconds:g} s") from None
    except (RecursionError, MemoryError) as exc:
        raise TemplateFailure(f"template {_shown(template)}: {type(exc).__name__}") from None
    except Exception as exc:  # whatever the template's own arithmetic raised
        raise TemplateFailure(f"template {_shown(template)}: {type(exc).__name__}: {exc}") from None


@functools.lru_cache(maxsize=512)
def _compiled(template: str) -> Template:
    """A rule set has a few dozen templates, rendered for every finding: each compiled once."""
    return _SANDBOX.from_string(template)


def _bounded_render(template: str, context: dict[str, Any], seconds: float) -> str:
    compiled = _compiled(template)
    parts: list[str] = []
    size = 0
    _WATCHDOG.arm(seconds)
    try:
        for part in compiled.generate(**context):
            size += len(part)
            if size > OUTPUT_CHARS:
                raise OverflowError(f"output over {OUTPUT_CHARS} characters")
            parts.append(part)
    finally:
        _WATCHDOG.disarm()
    return "".join(parts)


def _shown(template: str) -> str:
    return repr(template if len(template) <= 200 else template[:197] + "...")
