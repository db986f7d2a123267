"""The one Jinja2 environment of the report's HTML pages: templates from the package, autoescape on
(finding messages and notes are data), a missing variable an error rather than an empty cell."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, StrictUndefined

PAGES = Environment(
    loader=PackageLoader("stethoscope.report", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
