"""The audit page (`stethoscope audit --out DIR`): DIR/audit.html beside the board, through Jinja2 with
autoescape on (node names, kinds and messages are data); nothing is fetched when it is viewed."""

from __future__ import annotations

from pathlib import Path

from stethoscope.diagnosis.audit import Audit
from stethoscope.private_files import private_dir, write_private
from stethoscope.report.board_cells import SYMBOL
from stethoscope.report.pages import PAGES
from stethoscope.timeutil import iso, now_ms


def render_audit(audit: Audit, store_name: str = "", board_page: str = "") -> str:
    return PAGES.get_template("audit.html.j2").render(
        audit=audit, symbol=SYMBOL, generated_at=iso(now_ms()), store_name=store_name, board_page=board_page
    )


def write(audit: Audit, out: Path, store_name: str = "") -> Path:
    private_dir(out)
    board = "index.html" if (out / "index.html").exists() else ""  # `stethoscope report --out DIR`
    return write_private(out / "audit.html", render_audit(audit, store_name, board))
