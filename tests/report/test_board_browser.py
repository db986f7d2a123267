"""The board of the lab, loaded from disk by headless Chromium (Debian's) inside an empty network
namespace: no console error, the faulted nodes' cells red or yellow, the healthy ones green."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import TOP, swept_lab

CHROMIUM = shutil.which("chromium")
UNSHARE = shutil.which("unshare")


def _netns_works() -> bool:
    if not UNSHARE:
        return False
    return subprocess.run([UNSHARE, "-n", "true"], capture_output=True, check=False).returncode == 0


pytestmark = pytest.mark.skipif(
    not CHROMIUM or not _netns_works(),
    reason="needs Debian's chromium (apt-get install chromium) and `unshare -n` (root or user namespaces)",
)


class Cells(HTMLParser):
    """node -> [(layer, day, state)] from the dumped DOM's data attributes: the header's columns
    (data-layer, data-day), each row's node (data-node) and each cell's state (data-s)."""

    def __init__(self) -> None:
        super().__init__()
        self.node: str | None = None
        self.columns: list[tuple[str, str]] = []
        self.cells: dict[str, list[tuple[str, str, str]]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "th" and "data-day" in found:
            self.columns.append((found["data-layer"] or "", found["data-day"] or ""))
        elif tag == "tr" and "data-node" in found:
            self.node = found["data-node"] or ""
            self.cells[self.node] = []
        elif tag == "td" and "data-s" in found and self.node is not None:
            layer, day = self.columns[len(self.cells[self.node])]
            self.cells[self.node].append((layer, day, found["data-s"] or ""))


def chromium(page: Path, *flags: str) -> subprocess.CompletedProcess:
    """Chromium in a network namespace of its own with no interface up: any request would fail."""
    return subprocess.run(
        [UNSHARE or "unshare", "-n", CHROMIUM or "chromium", "--headless", "--no-sandbox", "--disable-gpu",
         "--enable-logging=stderr", "--v=0", "--user-data-dir=" + str(page.parent / ".chromium"),
         *flags, page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Uncaught" in line or "ERROR:CONSOLE" in line]


@pytest.fixture(scope="module")
def lab_board(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("board")
    dsn = f"chdb://{tmp / 'db'}"
    env = swept_lab(tmp, dsn)
    cli = [sys.executable, "-m", "stethoscope.cli"]
    diagnosed = subprocess.run([*cli, "diagnose", "--json"], env=env, cwd=TOP, capture_output=True, text=True)
    assert diagnosed.returncode in (0, 1), diagnosed.stderr
    report = subprocess.run(
        [*cli, "report", "--out", str(tmp / "out"), "--days", "3"],
        env=env,
        cwd=TOP,
        capture_output=True,
        text=True,
    )
    assert report.returncode == 0, report.stderr
    terminal = subprocess.run(
        [*cli, "report", "--days", "3"], env=env, cwd=TOP, capture_output=True, text=True
    )
    return tmp / "out", json.loads(diagnosed.stdout), terminal


def test_lab_board_in_chromium_faulted_nodes_red_or_yellow_healthy_green_no_console_error(lab_board):
    out, findings, _ = lab_board
    page = out / "index.html"
    dumped = chromium(page, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert console_errors(dumped.stderr) == []
    shot = chromium(page, f"--screenshot={out / 'board.png'}", "--window-size=1400,900", "--hide-scrollbars")
    assert shot.returncode == 0 and (out / "board.png").stat().st_size > 1000  # the test's artefact
    parser = Cells()
    parser.feed(dumped.stdout)
    cells = parser.cells
    alarmed = {f["node_id"] for f in findings if f["severity"] in ("warning", "critical")}
    assert alarmed and set(cells) >= alarmed
    today = max(day for node in cells.values() for _, day, _ in node)
    for node, states in cells.items():
        today_states = {state for _, day, state in states if day == today}
        if node in alarmed:
            assert today_states & {"red", "yellow"}, node
        elif not any(f["node_id"] == node for f in findings):
            assert "green" in today_states and not today_states & {"red", "yellow"}, node


def test_lab_board_terminal_table_lists_worst_nodes_first_without_colour_when_piped(lab_board):
    _, findings, terminal = lab_board
    assert terminal.returncode == 0, terminal.stderr
    assert "\033[" not in terminal.stdout
    rows = [line.split()[0] for line in terminal.stdout.splitlines()[1:-1]]
    critical = {f["node_id"] for f in findings if f["severity"] == "critical"}
    assert critical and set(rows[: len(critical)]) <= critical | {f["node_id"] for f in findings}


def test_node_named_with_a_script_tag_renders_as_text_in_chromium(store, tmp_path):
    from stethoscope.catalog import Catalog
    from stethoscope.report.board import collect, write
    from stethoscope.store.batch import MetricColumns
    from stethoscope.timeutil import now_ms

    name = '<script>document.title="pwned"</script>n1'
    batch = MetricColumns()
    batch.append(name, "gpu_temperature_celsius", "gpu0", {}, 61.0, now_ms() - 60_000)
    store.insert_metrics(batch)
    # two days: a sample a minute old is yesterday's in the first minute after midnight
    page = write(collect(store, Catalog.load(), 2, now_ms(), rules=[], evaluate=False), tmp_path / "out")
    dumped = chromium(page, "--dump-dom")
    assert dumped.returncode == 0, dumped.stderr[-2000:]
    assert console_errors(dumped.stderr) == []
    assert "<title>stethoscope health board</title>" in dumped.stdout  # the script never ran
    assert "&lt;script&gt;document.title" in dumped.stdout
    parser = Cells()
    parser.feed(dumped.stdout)
    assert list(parser.cells) == [name]
