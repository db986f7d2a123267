"""The process templates render in (stethoscope.templating starts it): Jinja2's sandbox, an undefined
name an error, the output capped, and the process's address space capped, so that a template that
asks for gigabytes gets a MemoryError here instead of the controller's memory; its parent kills it
at the time bound. One JSON request a line on stdin, one JSON answer a line on stdout.

    request:  {"template": TEXT, "context": {...}, "output_chars": N}
    answer:   {"ok": TEXT} | {"undefined": ERROR} | {"failed": ERROR}
"""

from __future__ import annotations

import functools
import json
import resource
import sys
from typing import Any

from jinja2 import StrictUndefined, Template, TemplateError, UndefinedError
from jinja2.sandbox import SandboxedEnvironment

MEMORY_BYTES = 512 * 1024 * 1024


_SANDBOX = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


@functools.lru_cache(maxsize=512)
def _compiled(template: str) -> Template:
    """A rule set has a few dozen templates, rendered for every finding: each compiled once."""
    return _SANDBOX.from_string(template)


def _render(request: dict[str, Any]) -> dict[str, str]:
    cap = int(request["output_chars"])
    try:
        parts, size = [], 0
        for part in _compiled(request["template"]).generate(**request["context"]):
            size += len(part)
            if size > cap:
                return {"failed": f"output over {cap} characters"}
            parts.append(part)
        return {"ok": "".join(parts)}
    except UndefinedError as exc:
        return {"undefined": str(exc)}
    except TemplateError as exc:
        return {"failed": str(exc)}
    except (MemoryError, RecursionError) as exc:
        return {"failed": f"{type(exc).__name__}: past the renderer's bounds"}
    except Exception as exc:  # whatever the template's own arithmetic raised
        return {"failed": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    for line in sys.stdin:
        answer = _render(json.loads(line))
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
