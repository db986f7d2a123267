"""Append-only NDJSON spool: what the store could not take now is kept here and replayed later.

A row is acknowledged once it is in ClickHouse or fsynced here. Each append writes one new file
(`<table>-<ms>-<pid>-<seq>.ndjson.part`), fsyncs it and renames it into place, so a replay never reads
a file still being written. A `.part` left by a writer that died (kill -9) is replayed too, with a
torn last line tolerated: what was fsynced before the kill is never lost.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.client import ROW_TABLES, Store

TABLES = ("metrics", *ROW_TABLES)
_seq = itertools.count()


@dataclass
class ReplayReport:
    rows: int = 0
    files: int = 0
    torn_lines: int = 0
    rejected_lines: int = 0
    problems: list[str] = field(default_factory=list)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Spool:
    def __init__(self, directory: str | os.PathLike[str]):
        self.dir = Path(directory)

    # writing ----------------------------------------------------------------------------------
    def append(self, table: str, rows: list[dict[str, Any]]) -> Path | None:
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}")
        if not rows:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"{table}-{time.time_ns() // 1_000_000}-{os.getpid()}-{next(_seq)}.ndjson"
        part = self.dir / (name + ".part")
        with open(part, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, separators=(",", ":"), sort_keys=True))
                handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        final = self.dir / name
        os.replace(part, final)
        self._fsync_dir()
        return final

    def append_batch(self, batch: Batch) -> list[Path]:
        written = [self.append("metrics", batch.metrics.rows())]
        written += [self.append(table, rows) for table, rows in _row_tables(batch)]
        return [path for path in written if path is not None]

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # reading ----------------------------------------------------------------------------------
    def pending(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        files = sorted(self.dir.glob("*.ndjson"))
        for part in sorted(self.dir.glob("*.ndjson.part")):
            pid = _writer_pid(part)
            if pid is not None and not _pid_alive(pid):
                files.append(part)
        return files

    def pending_rows(self) -> int:
        total = 0
        for path in self.pending():
            with open(path, "rb") as handle:
                total += sum(1 for line in handle if line.endswith(b"\n"))
        return total

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def replay(self, store: Store) -> ReplayReport:
        """Write every pending file to the store and remove it; a file that fails stays for next time."""
        report = ReplayReport()
        with self._locked():
            for path in self.pending():
                table = path.name.split("-", 1)[0]
                if table not in TABLES:
                    report.problems.append(f"{path}: unknown table {table!r}, left in place")
                    continue
                rows = self._read(path, report)
                if table == "metrics":
                    store.insert_metrics(MetricColumns.from_rows(rows))
                else:
                    store.insert_rows(table, rows)
                report.rows += len(rows)
                report.files += 1
                path.unlink()
        return report

    def _read(self, path: Path, report: ReplayReport) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        rejected: list[str] = []
        data = path.read_bytes()
        lines = data.split(b"\n")
        torn_tail = lines.pop()  # text after the last newline: empty, or a line cut by a crash
        if torn_tail:
            report.torn_lines += 1
            report.problems.append(f"{path.name}: torn last line ({len(torn_tail)} bytes) skipped")
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                rows.append(json.loads(raw))
            except ValueError:
                rejected.append(raw.decode("utf-8", "replace"))
                report.problems.append(f"{path.name}:{number}: not JSON, moved to rejected/")
        if rejected:
            report.rejected_lines += len(rejected)
            bad = self.dir / "rejected"
            bad.mkdir(exist_ok=True)
            with open(bad / path.name.removesuffix(".part"), "a", encoding="utf-8") as handle:
                handle.write("\n".join(rejected) + "\n")
        return rows


def _row_tables(batch: Batch) -> list[tuple[str, list[dict[str, Any]]]]:
    return [
        ("facts", batch.facts),
        ("bench_results", batch.bench),
        ("fingerprints", batch.fingerprints),
        ("nodes", batch.nodes),
    ]


def _writer_pid(path: Path) -> int | None:
    try:
        return int(path.name.split("-")[2])
    except (IndexError, ValueError):
        return None
