"""Append-only NDJSON spool: what the store could not take now is kept here and replayed later.

A row is acknowledged once it is in ClickHouse or fsynced here. Each append writes one new file
(`<table>-<ms>-<pid>-<seq>.ndjson.part`), fsyncs it and renames it into place, so a replay never reads
a file still being written. A `.part` left by a writer that died (kill -9) is replayed too, with a
torn last line tolerated: what was fsynced before the kill is never lost; one killed before its header
was down holds nothing and is removed.

Each file starts with a header naming the DSN (no password, no options) and database it was meant
for, and replays only into that one unless moved on purpose (`spool replay --into`); a file whose
header is damaged can be replayed nowhere and is quarantined at once, with the reason. A replay has
two halves: inserting (reads files, writes only to ClickHouse: a thread that may hang) and settling
(removes what was stored, counts failed attempts, quarantines a file after MAX_ATTEMPTS: the caller's
thread, under the spool lock). A file that keeps failing never blocks the others. A refusal for the
store's own state (too many parts, a memory limit) blames no file: the replay stops there, every
file stays pending and no attempt is counted.

Replays are row by row safe: each row is checked against its table (store.rows) and one the store
refuses is found alone (store.salvage); such rows, and lines that are not JSON, go to `rejected/`
with their reason, and the rest of their file is stored. Files are 0600 in 0700 folders: rows can
carry what a node said about itself.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.private_files import private_dir
from stethoscope.store import rows as row_check
from stethoscope.store.batch import Batch
from stethoscope.store.client import ROW_TABLES, Store
from stethoscope.store.dsn import database_of, redact, resolve_dsn, target_of
from stethoscope.store.holder import pid_alive
from stethoscope.store.salvage import RowsRefused, StoreBusy, insert_salvaging

TABLES = ("metrics", *ROW_TABLES)
HEADER = "__spool__"
EMPTY_START = "the file is empty or starts with an empty line"
CUT_FIRST_LINE = "its first line is cut before its end"
MAX_ATTEMPTS = 3
_seq = itertools.count()


@dataclass(frozen=True)
class Target:
    dsn: str  # target_of(): where, without password or options
    database: str

    @classmethod
    def of(cls, dsn: str | None, database: str | None = None) -> Target:
        resolved = resolve_dsn(dsn, database)
        return cls(target_of(resolved), database_of(resolved))

    def __str__(self) -> str:
        return f"{self.dsn} database {self.database}"


@dataclass
class FileOutcome:
    """What inserting one spool file did; produced without touching the spool."""

    path: Path
    rows: int = 0
    error: str | None = None
    busy: str | None = None  # the store refused for its own state: the file waits, no attempt counted
    bad_lines: list[str] = field(default_factory=list)
    refused: list[row_check.Refused] = field(default_factory=list)  # rows no table takes, with why
    torn_bytes: int = 0


@dataclass
class ReplayReport:
    rows: int = 0
    files: int = 0
    torn_lines: int = 0
    rejected_lines: int = 0
    quarantined: list[str] = field(default_factory=list)
    other_targets: int = 0  # files left for the database they were written for
    problems: list[str] = field(default_factory=list)


@dataclass
class FileStatus:
    path: Path
    target: str
    table: str
    rows: int
    age_seconds: float
    attempts: int
    last_error: str


class Spool:
    def __init__(
        self, directory: str | os.PathLike[str], dsn: str | None = None, database: str | None = None
    ):
        self.dir = Path(directory)
        self._dsn, self._database = dsn, database
        self._target: Target | None = None
        self._headers_read: set[Path] = set()  # files whose header was found sound (files never change)

    @property
    def target(self) -> Target:
        """The database this spool's appends are meant for (resolved on first use)."""
        if self._target is None:
            self._target = Target.of(self._dsn, self._database)
        return self._target

    @property
    def quarantine_dir(self) -> Path:
        return self.dir / "quarantine"

    @property
    def rejected_dir(self) -> Path:
        return self.dir / "rejected"

    # writing ----------------------------------------------------------------------------------
    def append(self, table: str, rows: Iterable[dict[str, Any]]) -> Path | None:
        """Rows into a new file; an iterator (taken as not empty) is written as it goes, so a full
        disk stops it at the first block rather than after every row was made."""
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}")
        if not rows:
            return None
        header = {HEADER: {"dsn": self.target.dsn, "database": self.target.database, "table": table}}
        name = f"{table}-{time.time_ns() // 1_000_000}-{os.getpid()}-{next(_seq)}.ndjson"
        return self._write(self.dir, name, itertools.chain([header], rows))

    def reject(self, rejected: list[dict[str, Any]]) -> Path | None:
        """Rows no table can take (a value that is not a finite number), each a record {table,
        reason, row} (or {table, reason, line} for text that was no row)."""
        if not rejected:
            return None
        name = f"rejected-{time.time_ns() // 1_000_000}-{os.getpid()}-{next(_seq)}.ndjson"
        return self._write(self.rejected_dir, name, rejected)

    def reject_batch(self, batch: Batch, reason: str) -> Path | None:
        """A whole batch no database will take (a configuration error), each row with `reason`."""
        rows = [{"table": "metrics", "reason": reason, "row": row} for row in batch.metrics.rows()]
        for table, table_rows in [
            ("facts", batch.facts),
            ("bench_results", batch.bench),
            *_row_tables(batch)[2:],
        ]:
            rows += [{"table": table, "reason": reason, "row": row} for row in table_rows]
        return self.reject(rows + batch.rejected)

    def _write(self, folder: Path, name: str, lines: Iterable[dict[str, Any]]) -> Path:
        private_dir(self.dir)
        private_dir(folder)
        part = folder / (name + ".part")
        try:
            with _private_open(part) as handle:
                for line in lines:
                    handle.write(json.dumps(line, separators=(",", ":"), sort_keys=True, default=str))
                    handle.write("\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError:  # a full disk: the caller keeps the rows; a half file would replay as torn
            with suppress(OSError):
                part.unlink()
            raise
        final = folder / name
        os.replace(part, final)
        _fsync_dir(folder)
        return final

    # reading ----------------------------------------------------------------------------------
    def pending(self) -> list[Path]:
        if not self.dir.is_dir():
            return []
        files = sorted(self.dir.glob("*.ndjson"))
        for part in sorted(self.dir.glob("*.ndjson.part")):
            pid = _writer_pid(part)
            if pid is not None and not pid_alive(pid):
                files.append(part)
        return files

    def pending_for(self, target: Target) -> list[Path]:
        return [path for path in self.pending() if file_target(path) == target]

    def pending_rows(self) -> int:
        return sum(_count_rows(path) for path in self.pending())

    def status(self) -> list[FileStatus]:
        now = time.time()
        listed = []
        for path in self.pending():
            target = file_target(path)
            attempts, error = self._attempts(path)
            try:
                age = now - path.stat().st_mtime
            except OSError:
                continue
            listed.append(
                FileStatus(
                    path,
                    str(target) if target else "unknown (written before spool files named their database)",
                    table_of(path),
                    _count_rows(path),
                    age,
                    attempts,
                    error,
                )
            )
        return listed

    def rejected(self) -> tuple[int, Counter[str]]:
        """How many rows are kept in rejected/, and how many for each kind of reason."""
        kinds: Counter[str] = Counter()
        if not self.rejected_dir.is_dir():
            return 0, kinds
        for path in sorted(self.rejected_dir.glob("*.ndjson")):
            try:
                lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    reason = str(json.loads(line).get("reason") or "?")
                except (ValueError, AttributeError):
                    reason = "?"
                kinds[reason.split(" (", 1)[0]] += 1
        return sum(kinds.values()), kinds

    def quarantined(self) -> list[tuple[Path, str]]:
        if not self.quarantine_dir.is_dir():
            return []
        found = []
        for path in sorted(self.quarantine_dir.glob("*.ndjson*")):
            if path.name.endswith(".reason"):
                continue
            reason = path.with_name(path.name + ".reason")
            found.append((path, reason.read_text(encoding="utf-8").strip() if reason.exists() else "?"))
        return found

    # replaying --------------------------------------------------------------------------------
    def replay(self, store: Store, into: bool = False) -> ReplayReport:
        """Write this store's pending files (every file with `into`), then settle them."""
        here = Target.of(store.dsn, store.database)
        report = ReplayReport()
        self.quarantine_damaged(report)
        everything = self.pending()
        chosen = everything if into else [path for path in everything if file_target(path) == here]
        report.other_targets = len(everything) - len(chosen)
        self.settle(insert_files(store, chosen), str(here), report)
        return report

    def quarantine_damaged(self, report: ReplayReport) -> None:
        """Files whose header is damaged belong to no database: quarantined now, with the reason,
        rather than waiting for a replay that can never choose them."""
        damaged = []
        pending = self.pending()
        self._headers_read &= set(pending)
        for path in pending:
            if path not in self._headers_read:
                problem = header_problem(path)
                if problem is None:
                    self._headers_read.add(path)
                damaged.append((path, problem))
        if not any(problem for _path, problem in damaged):
            return
        with self._locked():
            for path, problem in damaged:
                if problem is None or not path.exists():
                    continue
                if path.name.endswith(".part") and _header_never_written(path, problem):
                    # its writer died before the header was down: no row in it was ever acknowledged
                    _unlink(path)
                    report.problems.append(f"{path.name}: torn before its header was written, removed")
                    continue
                self._quarantine(path, f"damaged header: {problem}", report)

    def settle(self, outcomes: list[FileOutcome], where: str, report: ReplayReport) -> None:
        """Remove stored files, count failures, quarantine a file that failed MAX_ATTEMPTS times."""
        with self._locked():
            for outcome in outcomes:
                path = outcome.path
                if outcome.busy is not None:  # the store's state, not the file's: it stays as it is
                    report.problems.append(f"{path.name}: not replayed now, tried later: {outcome.busy}")
                    continue
                if outcome.error is not None:  # its bad rows stay in it, set aside when it replays
                    self._failed(path, outcome.error, where, report)
                    continue
                if not path.exists():  # another replay stored it meanwhile
                    continue
                self._set_aside(outcome, report)
                if outcome.torn_bytes:
                    report.torn_lines += 1
                    report.problems.append(
                        f"{path.name}: torn last line ({outcome.torn_bytes} bytes) skipped"
                    )
                report.rows += outcome.rows
                report.files += 1
                _unlink(path)
                _unlink(_attempts_path(path))

    def _set_aside(self, outcome: FileOutcome, report: ReplayReport) -> None:
        """A stored file's lines that were no row and rows no table took, kept in rejected/."""
        if not outcome.bad_lines and not outcome.refused:
            return
        name, table = outcome.path.name.removesuffix(".part"), table_of(outcome.path)
        records = [{"table": table, "reason": "not JSON", "line": line} for line in outcome.bad_lines]
        records += [{"table": table, "reason": reason, "row": row} for row, reason in outcome.refused]
        self._write(self.rejected_dir, f"rejected-{name}", [{**r, "from": name} for r in records])
        report.rejected_lines += len(records)
        reasons = Counter(str(record["reason"]).split(" (", 1)[0] for record in records)
        said = ", ".join(f"{count} {reason}" for reason, count in reasons.most_common(3))
        report.problems.append(f"{name}: {len(records)} rows set aside in rejected/ ({said})")

    def _failed(self, path: Path, error: str, where: str, report: ReplayReport) -> None:
        if not path.exists():  # another replay stored it meanwhile
            return
        attempts = self._attempts(path)[0] + 1
        if attempts < MAX_ATTEMPTS:
            _write_private(_attempts_path(path), json.dumps({"attempts": attempts, "error": error}))
            report.problems.append(
                f"{path.name}: replay attempt {attempts} of {MAX_ATTEMPTS} failed: {error}"
            )
            return
        self._quarantine(path, f"failed {attempts} replays into {where}: {error}", report)

    def _quarantine(self, path: Path, why: str, report: ReplayReport) -> None:
        private_dir(self.quarantine_dir)
        moved = self.quarantine_dir / path.name
        _write_private(moved.with_name(moved.name + ".reason"), why + "\n")
        shutil.move(path, moved)
        _unlink(_attempts_path(path))
        _fsync_dir(self.quarantine_dir)
        report.quarantined.append(str(moved))
        report.problems.append(f"{path.name}: moved to {moved} ({why})")

    def _attempts(self, path: Path) -> tuple[int, str]:
        try:
            record = json.loads(_attempts_path(path).read_text(encoding="utf-8"))
            return int(record["attempts"]), str(record.get("error", ""))
        except (OSError, ValueError, KeyError, TypeError):
            return 0, ""

    @contextmanager
    def _locked(self) -> Iterator[None]:
        private_dir(self.dir)
        with _private_open(self.dir / ".lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


# inserting: reads the spool, writes only to ClickHouse -------------------------------------------
def insert_files(store: Store, paths: list[Path]) -> list[FileOutcome]:
    """Insert each file's rows, setting aside those no table takes; a file the store refuses as a
    whole gets its error, the others go on. When the store refuses for its own state (too many
    parts, memory: StoreBusy), the file waits (`busy`) and the rest are left for a later replay.

    Raises StoreError when the store itself stops answering: then no file is at fault.
    """
    outcomes = []
    for path in paths:
        outcome = FileOutcome(path)
        try:
            rows = read_rows(path, outcome)
        except FileNotFoundError:  # stored and removed by another replay meanwhile
            continue
        table = table_of(path)
        if table not in TABLES:
            outcome.error = f"unknown table {table!r} (from the file's name)"
            outcomes.append(outcome)
            continue
        good, outcome.refused = row_check.split(table, rows)
        try:
            outcome.rows, refused = insert_salvaging(store, table, good)
            outcome.refused += refused
        except RowsRefused as exc:
            outcome.error = redact(exc)
        except StoreBusy as exc:  # the rows it took already are written again when the file replays
            outcome.rows, outcome.refused, outcome.busy = 0, [], redact(exc)
            outcomes.append(outcome)
            break
        outcomes.append(outcome)
    return outcomes


def read_rows(path: Path, outcome: FileOutcome) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    lines = path.read_bytes().split(b"\n")
    torn_tail = lines.pop()  # text after the last newline: empty, or a line cut by a crash
    outcome.torn_bytes = len(torn_tail)
    for raw in lines:
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError:
            outcome.bad_lines.append(raw.decode("utf-8", "replace"))
            continue
        if isinstance(row, dict) and HEADER in row:
            continue
        rows.append(row)
    return rows


def file_target(path: Path) -> Target | None:
    """The database a spool file was written for; None for a file from before headers, or one whose
    header is damaged (header_problem says which)."""
    try:
        with open(path, "rb") as handle:
            first = json.loads(handle.readline())
        header = first[HEADER]
        return Target(str(header["dsn"]), str(header["database"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _header_never_written(path: Path, problem: str) -> bool:
    """An empty file, or one whose only line is cut (a file whose first line is blank but holds rows
    after it is damaged, not unwritten)."""
    try:
        empty = path.stat().st_size == 0
    except OSError:
        return False
    return empty or problem == CUT_FIRST_LINE


def header_problem(path: Path) -> str | None:
    """What is wrong with a spool file's header line, or None (a good header, or a file from before
    headers, whose first line is a row)."""
    try:
        with open(path, "rb") as handle:
            first = handle.readline()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if not first.strip():
        return EMPTY_START
    if not first.endswith(b"\n"):
        return CUT_FIRST_LINE
    try:
        line = json.loads(first)
    except ValueError:
        return "its first line is not JSON"
    if not isinstance(line, dict):
        return "its first line is not an object"
    if HEADER not in line:  # a file from before headers starts with a row (all of those had a node)
        return None if "node_id" in line else "its first line is neither a header nor a row"
    header = line[HEADER]
    if not isinstance(header, dict) or not all(isinstance(header.get(k), str) for k in ("dsn", "database")):
        return "it names no DSN and database"
    return None


def table_of(path: Path) -> str:
    return path.name.split("-", 1)[0]


def _count_rows(path: Path) -> int:
    try:
        with open(path, "rb") as handle:
            lines = [line for line in handle if line.endswith(b"\n")]
    except OSError:
        return 0
    return len(lines) - (1 if lines and HEADER.encode() in lines[0][:20] else 0)


def _attempts_path(path: Path) -> Path:
    return path.with_name(path.name + ".attempts")


def _unlink(path: Path) -> None:
    with suppress(FileNotFoundError):
        path.unlink()


def _private_open(path: Path) -> Any:
    """A file opened for writing with mode 0600 (a new one; an existing one is truncated)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w", encoding="utf-8")


def _write_private(path: Path, text: str) -> None:
    with _private_open(path) as handle:
        handle.write(text)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
