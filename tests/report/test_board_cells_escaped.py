"""The board's cells, drawn in Python rather than by the template (board_html.board_row, node_row),
escape what a finding's message says as the template's autoescape did: a message is anyone's text."""

from __future__ import annotations

from stethoscope.report.board_cells import Cell, NodeBoard
from stethoscope.report.board_html import board_row, node_row

HOSTILE = '"><script>alert(1)</script> & <b>'


def test_a_cell_note_with_markup_is_text_in_its_title_on_the_board_and_the_node_page():
    red = Cell()
    red.mark("red", HOSTILE)
    node = NodeBoard("node01", {("compute", "2026-12-07"): red, ("network", "2026-12-07"): Cell()})
    for html in (
        str(board_row(node, ("compute", "network"), ["2026-12-07"])),
        str(node_row(node, "compute", ["2026-12-07"])),
    ):
        assert "<script>" not in html and "<b>" not in html
        assert 'title="&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt; &amp; &lt;b&gt;"' in html
        assert html.startswith('<td data-s="red"')
