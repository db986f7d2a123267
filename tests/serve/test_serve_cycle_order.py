"""serve publishes a cycle only once its board is written: a client that sees `cycles >= 1` on
/healthz gets the board on /report (CI once read 503 "no board yet" in between)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.remediation.cycle import CycleResult
from stethoscope.report import board
from stethoscope.serve import Server
from stethoscope.telemetry.keyring import Keyring


class _NoFindings:
    """serve's Cycles at its seam: one cycle that matched nothing, in a dry run."""

    execute_with = None

    def run(self, rules: list, at_ms: int, store: Any = None) -> CycleResult:
        return CycleResult(at_ms=at_ms, findings=[], rules=len(rules), executing=False)


def test_a_cycle_is_counted_only_after_its_board_is_served(store, tmp_path: Path, monkeypatch) -> None:
    store.init_schema()
    server = Server(
        store=store,
        spool_dir=tmp_path / ".stethoscope" / "spool",
        keyring=Keyring({}, [b"s" * 32]),
        sets={},
        listen=("127.0.0.1", 0),
        http=None,
        interval=1,
        rules=list,
        catalog=Catalog.load(),
        cycles=_NoFindings(),  # type: ignore[arg-type]
    )
    seen_while_writing: list[tuple[int, bytes | None]] = []
    write = board.write

    def observed_write(today: board.Board, out: Path, **kwargs: Any) -> Path:
        seen_while_writing.append((server.health()[1]["cycles"], server.page("index.html")))
        return write(today, out, **kwargs)

    monkeypatch.setattr(board, "write", observed_write)
    server.cycle()
    assert seen_while_writing == [(0, None)]  # not counted while its board is not there yet
    assert server.health()[1]["cycles"] == 1
    assert b"<h1>Health board</h1>" in (server.page("index.html") or b"")
