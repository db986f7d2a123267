"""The board's pages through Jinja2 with autoescape on (node names and messages are data), and its
figures as inline SVG from matplotlib (nothing is fetched when the page is viewed)."""

from __future__ import annotations

import datetime as dt
import io
import re

from markupsafe import Markup

from stethoscope.report.board_cells import SYMBOL, Board, NodeBoard
from stethoscope.report.pages import PAGES
from stethoscope.report.smart import GROWTH_ALARM, MONTH_DAYS, Trend


def render_board(board: Board) -> str:
    return PAGES.get_template("board.html.j2").render(board=board, symbol=SYMBOL, alarm=GROWTH_ALARM)


def render_node(board: Board, node: NodeBoard) -> str:
    return PAGES.get_template("node.html.j2").render(
        board=board, node=node, symbol=SYMBOL, alarm=GROWTH_ALARM, figure=Markup(node.figure)
    )


def trend_svg(trends: list[Trend]) -> Markup:
    """The wear attributes' daily values, each with the line a 50 %-a-month growth would draw."""
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # text stays text: no glyph paths, no fonts fetched
    figure, axes = plt.subplots(figsize=(7, 2.6))
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
    figure.tight_layout()
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    plt.close(figure)
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]  # inline: no XML prolog or DOCTYPE
    return Markup(re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S))
