"""The board's pages through Jinja2 with autoescape on (node names and messages are data), and its
figures as inline SVG from matplotlib (nothing is fetched when the page is viewed)."""

from __future__ import annotations

import datetime as dt
import functools
import io
import re
import threading
from typing import Any

from markupsafe import Markup, escape

from stethoscope.report.board_cells import SYMBOL, Board, NodeBoard
from stethoscope.report.pages import PAGES
from stethoscope.report.smart import GROWTH_ALARM, MONTH_DAYS, Trend

_SAVING = threading.Lock()


def render_board(board: Board) -> str:
    return PAGES.get_template("board.html.j2").render(
        board=board, symbol=SYMBOL, alarm=GROWTH_ALARM, cells=board_row
    )


def render_node(board: Board, node: NodeBoard) -> str:
    return PAGES.get_template("node.html.j2").render(
        board=board,
        node=node,
        symbol=SYMBOL,
        alarm=GROWTH_ALARM,
        figure=Markup(node.figure),
        cells=node_row,
    )


def board_row(node: NodeBoard, layers: tuple[str, ...], days: list[str]) -> Markup:
    """The node's row on the board: a cell per layer and day, its notes as its title where it has any."""
    return Markup("".join(_cell(state, notes) for state, _symbol, notes in node.row(layers, days)))


def node_row(node: NodeBoard, layer: str, days: list[str]) -> Markup:
    """A layer's row on the node's page: a cell per day, titled with its notes, else its state."""
    return Markup("".join(_cell(state, notes or state) for state, _symbol, notes in node.row((layer,), days)))


@functools.lru_cache(maxsize=4096)
def _cell(state: str, title: str) -> str:
    """One cell's HTML, escaped as the templates escape. Drawn here, not in the templates: the board
    of 2,000 nodes has 56,000 cells, most of them alike, and a template spent a second on them."""
    titled = f' title="{escape(title)}"' if title else ""
    return f'<td data-s="{escape(state)}"{titled}>{escape(SYMBOL[state])}</td>'


def trend_svg(trends: list[Trend]) -> Markup:
    """The wear attributes' daily values, each with the line a 50 %-a-month growth would draw."""
    from matplotlib import rc_context

    figure = _trend_figure(trends)
    buffer = io.StringIO()
    # rc_context sets matplotlib's global parameters while it lasts: one figure at a time
    with _SAVING, rc_context({"svg.fonttype": "none"}):  # text stays text: no glyph paths, no fonts
        figure.savefig(buffer, format="svg")
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]  # inline: no XML prolog or DOCTYPE
    return Markup(re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S))


def _trend_figure(trends: list[Trend]) -> Any:
    # a Figure of its own (no pyplot: nothing global to close) with fixed margins that hold 7-digit
    # ticks: tight_layout drew each figure once more only to measure them, 3x the cost of drawing it
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 2.6))
    figure.subplots_adjust(left=0.09, right=0.985, bottom=0.17, top=0.91)
    axes = figure.subplots()
    origin = min(dt.date.fromisoformat(trend.days[0]) for trend in trends)
    for trend in trends:
        days = [(dt.date.fromisoformat(day) - origin).days for day in trend.days]
        label = f"{trend.device} {trend.metric} ({trend.growth_text}/month)"
        axes.plot(days, trend.values, marker=".", label=label)
        start = trend.values[0] or 1.0
        alarm = [start * (1 + GROWTH_ALARM / 100) ** ((d - days[0]) / MONTH_DAYS) for d in days]
        axes.plot(days, alarm, linestyle="--", color="#e53935", linewidth=1)
    axes.plot([], [], linestyle="--", color="#e53935", label=f"> {GROWTH_ALARM:.0f} % a month")
    axes.set_xlabel(f"days since {origin.isoformat()}")
    for text in axes.legend(fontsize=7, loc="upper left").get_texts():
        text.set_parse_math(False)  # device names are data: `$` is no math, `_` `^` `\` no syntax
        text.set_usetex(False)
    return figure
