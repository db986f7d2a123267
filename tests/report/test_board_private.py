"""The board renders any device name and is its owner's only: a device name with `$` made
matplotlib parse the trend chart's legend as mathtext and fail, so `stethoscope report` exited 3
and serve skipped the board every cycle; the board, the baseline page and the state folder (the
embedded database among it) were readable by every user of the controller."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from stethoscope.report.board import DAY_MS
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

# mathtext: text between two `$` is math, where `^` `_` `\` are syntax ("sd$a^_\x$" raised, "nvme$0$n1"
# drew "nvme0n1")
DEVICES = ("sd$a^_\\x", "sd$a^_\\x$", "nvme$0$n1", "sd{b}%")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def stethoscope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", *args],
        cwd=TOP,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def wearing_drives(dsn: str) -> None:
    """Drives whose reallocated sectors grow over two months: the board draws their trend."""
    today = now_ms() - now_ms() % DAY_MS
    batch = MetricColumns()
    for back in range(0, 61, 5):
        for device in DEVICES:
            at = today - back * DAY_MS + 3_600_000
            batch.append("node01", "smart_reallocated_sector_ct", device, {}, float(200 - back * 3), at)
    with Store(dsn) as store:
        store.init_schema()
        store.insert_metrics(batch)


def test_report_draws_the_trend_of_a_device_named_with_mathtext(tmp_path, tmp_dsn):
    """Regression: a device named with `$` made `stethoscope report` exit 3 (matplotlib's mathtext)."""
    wearing_drives(tmp_dsn)
    out = tmp_path / "board"
    result = stethoscope("--dsn", tmp_dsn, "report", "--out", str(out), "--no-model")
    assert result.returncode == 0, result.stderr
    (page,) = (out / "nodes").glob("node01-*.html")
    text = page.read_text(encoding="utf-8")
    assert "<svg" in text
    for device in DEVICES:  # the legend's text as written, not math (which is drawn, not text)
        assert f">{device} smart_reallocated_sector_ct" in text, device


@pytest.fixture
def open_umask():
    """The most permissive umask: the modes are the code's, not the umask's."""
    before = os.umask(0)
    yield
    os.umask(before)


def test_the_board_is_its_owners_only(tmp_path, tmp_dsn, open_umask):
    """Regression: the board folder was 0755 and its pages 0644."""
    wearing_drives(tmp_dsn)
    out = tmp_path / "reports" / "board"
    result = stethoscope("--dsn", tmp_dsn, "report", "--out", str(out), "--no-model")
    assert result.returncode == 0, result.stderr
    assert {mode(folder) for folder in (out.parent, out, out / "nodes")} == {0o700}
    assert {mode(page) for page in [out / "index.html", *(out / "nodes").iterdir()]} == {0o600}


def test_a_board_page_left_world_readable_is_private_once_rewritten(tmp_path, tmp_dsn):
    wearing_drives(tmp_dsn)
    out = tmp_path / "board"
    out.mkdir(mode=0o755)
    (out / "index.html").write_text("a stale page")
    (out / "index.html").chmod(0o644)
    result = stethoscope("--dsn", tmp_dsn, "report", "--out", str(out), "--no-model")
    assert result.returncode == 0, result.stderr
    assert mode(out / "index.html") == 0o600 and "stale" not in (out / "index.html").read_text()


def test_the_baseline_page_is_its_owners_only(tmp_path, tmp_dsn, open_umask):
    """Regression: `stethoscope baseline --out` wrote baseline.html 0644 into a 0755 folder."""
    with Store(tmp_dsn) as store:
        store.init_schema()
    out = tmp_path / "pages"
    result = stethoscope("--dsn", tmp_dsn, "baseline", "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert mode(out) == 0o700 and mode(out / "baseline.html") == 0o600


def test_the_state_folder_and_the_embedded_database_are_their_owners_only(tmp_path, open_umask):
    """Regression: .stethoscope/ and .stethoscope/db were 0755: the findings, the incidents' evidence
    and the raw metrics were readable by every user of the controller."""
    home = tmp_path / "home"
    env = {**os.environ, "STETHOSCOPE_HOME": str(home)}
    env.pop("STETHOSCOPE_DSN", None)
    result = stethoscope("db", "init", env=env)
    assert result.returncode == 0, result.stderr
    assert mode(home / ".stethoscope") == 0o700 and mode(home / ".stethoscope" / "db") == 0o700


def test_an_embedded_database_named_by_its_dsn_is_created_its_owners_only(tmp_path, open_umask):
    db = tmp_path / "elsewhere" / "db"
    result = stethoscope("--dsn", f"chdb://{db}", "db", "init")
    assert result.returncode == 0, result.stderr
    assert mode(db) == 0o700 and mode(db.parent) == 0o700
