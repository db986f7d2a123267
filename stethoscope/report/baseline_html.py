"""The baseline page (`stethoscope baseline --out DIR`): the graded rows through a Jinja2 template with
autoescape on, since node names, labels and hints are data, not markup."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, StrictUndefined

from stethoscope.bench.baseline import RED, YELLOW, Row

_ENV = Environment(
    loader=PackageLoader("stethoscope.report", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    keep_trailing_newline=True,
)


def notes(row: Row) -> list[str]:
    found = ["unstable" if row.unstable else "", ">3σ own history" if row.beyond_3_sigma else ""]
    return [note for note in found + row.hints if note]


def render_html(rows: list[Row]) -> str:
    return _ENV.get_template("baseline.html.j2").render(rows=rows, notes=notes, red=RED, yellow=YELLOW)
