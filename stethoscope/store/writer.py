"""The acknowledged write: into ClickHouse, or else fsynced into the spool. Nothing is dropped.

A write that may hang runs in a thread that talks only to ClickHouse; every spool change (append,
remove, quarantine) is made by the caller's thread, so a thread left behind by a timeout holds no
lock and changes nothing on disk. After a timeout, `spool_only` skips the wait for the rest of a run.

Rows no table can hold (a value that is not a finite number, a time past DateTime64's range) are set
aside in the spool's rejected/ folder before the write, each alone: the rest of the batch is written.
An embedded database held by another process is waited for half the write's timeout, or
STETHOSCOPE_OPEN_WAIT seconds where that is shorter (0: spool at once): a write never takes longer
than its timeout, whatever the environment says.

The writer never raises for its spool: rows a full or read-only disk refuses come back in the report
(`held`, with `spool_error`) for the caller to hold (store.hold) and hand to its next write.
"""

from __future__ import annotations

import threading
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.paths import default_spool_dir
from stethoscope.store import rows as row_check
from stethoscope.store.batch import Batch
from stethoscope.store.client import Store, StoreError, open_wait_seconds
from stethoscope.store.dsn import ConfigError, redact, resolve_dsn
from stethoscope.store.hold import held_rows
from stethoscope.store.spool import FileOutcome, ReplayReport, Spool, insert_files

# the spool's tables and the Batch fields that carry them
_SPOOL_TABLES = (
    ("metrics", "metrics"),
    ("facts", "facts"),
    ("bench_results", "bench"),
    ("fingerprints", "fingerprints"),
    ("nodes", "nodes"),
)


@dataclass
class WriteReport:
    stored: int = 0
    spooled: int = 0
    replayed: int = 0
    rejected: int = 0
    error: str | None = None
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)
    # rows neither stored nor spooled: the caller holds them and hands them to its next write
    held: Batch = field(default_factory=Batch)
    spool_error: str | None = None  # why the spool refused them (a full or read-only disk)

    def summary(self) -> dict[str, object]:
        """The report in plain values, the held rows counted: for a log line."""
        return {**{k: v for k, v in self.__dict__.items() if k != "held"}, "held": held_rows(self.held)}


class Writer:
    """Open, replay the spool, write, close; spool on any failure or when `timeout` runs out.

    A configuration error (bad scheme, unknown DSN option) raises ConfigError and spools nothing.
    """

    def __init__(
        self,
        dsn: str | None = None,
        spool_dir: str | Path | None = None,
        timeout: float = 10.0,
        database: str | None = None,
    ):
        self.dsn = resolve_dsn(dsn, database)  # ConfigError here, before anything is written
        self.spool = Spool(spool_dir or default_spool_dir(), self.dsn)
        self.timeout = timeout
        # never past half the timeout: the write (open, then insert) must end within the timeout
        self.open_wait = min(open_wait_seconds(default=timeout / 2), timeout / 2)

    def write(self, batch: Batch, spool_only: bool = False) -> WriteReport:
        report = WriteReport()
        _set_aside_unfit(batch)
        self._keep_rejected(batch, report)
        self._quarantine_damaged(report)
        # Benchmark results are few and expensive: on disk before anything else is tried; what the
        # spool refuses goes to the store with the rest.
        first = Batch(bench=batch.bench, fingerprints=batch.fingerprints)
        bench_files, refused = self._append(first, report)
        rest = Batch(batch.metrics, batch.facts, refused.bench, refused.fingerprints, batch.nodes)
        on_disk = len(first) - len(refused)
        if spool_only:
            report.error = "spooled without trying: the sink timed out earlier in this run"
            self._spool_or_hold(rest, report)
            report.spooled += on_disk
            return report
        outcome = self._attempt(rest, self._pending())
        if isinstance(outcome.get("config"), ConfigError):
            for path in bench_files:  # a setting to fix, not a sink to wait for: nothing stays spooled
                with suppress(OSError):
                    path.unlink(missing_ok=True)
            raise outcome["config"]  # type: ignore[misc]
        files = outcome.get("files")
        if not isinstance(files, list):
            files = None
        if files is not None:
            replay = self._settle(files, report)
            fresh = sum(f.rows for f in files if f.path in bench_files and not f.error)  # this batch's
            report.replayed = replay.rows - fresh
            report.problems.extend(replay.problems)
        if "error" in outcome or "stored" not in outcome:
            report.error = str(outcome.get("error", "write failed"))
            report.timed_out = bool(outcome.get("timed_out"))
            # A write that timed out may still land later; the Replacing engines fold the duplicate.
            self._spool_or_hold(rest, report)
            report.spooled += on_disk if any(path.exists() for path in bench_files) else 0
        else:
            report.stored = int(outcome["stored"])  # type: ignore[call-overload]
            report.stored += sum(f.rows for f in (files or []) if f.path in bench_files and f.error is None)
        return report

    def _keep_rejected(self, batch: Batch, report: WriteReport) -> None:
        """Rows no table can hold into rejected/, or, where its disk refuses them, into the report's held
        rows; the batch keeps them then too, for a caller that keeps the batch when the write fails."""
        if not batch.rejected:
            return
        try:
            self.spool.reject(batch.rejected)
        except OSError as exc:
            report.spool_error = self._spool_problem(exc)
            report.held.rejected.extend(batch.rejected)
            return
        report.rejected = len(batch.rejected)
        batch.rejected = []  # kept: whoever handles a failure of this write must not keep them again

    def _quarantine_damaged(self, report: WriteReport) -> None:
        damaged = ReplayReport()
        try:
            self.spool.quarantine_damaged(damaged)
        except OSError as exc:  # tried again at the next write
            damaged.problems.append(f"damaged spool files not quarantined now: {exc}")
        report.problems.extend(damaged.problems)

    def _pending(self) -> list:
        try:
            return self.spool.pending_for(self.spool.target)
        except OSError:  # an unreadable spool is replayed at a later write
            return []

    def _settle(self, files: list[FileOutcome], report: WriteReport) -> ReplayReport:
        replay = ReplayReport()
        try:
            self.spool.settle(files, str(self.spool.target), replay)
        except OSError as exc:  # the files stay and replay again: what the store took, it takes twice
            report.problems.append(f"spool files stored but not removed ({exc}): they replay again")
        return replay

    def _spool_or_hold(self, batch: Batch, report: WriteReport) -> None:
        _files, refused = self._append(batch, report)
        report.spooled += len(batch) - len(refused)
        report.held.extend(refused)

    def _append(self, batch: Batch, report: WriteReport) -> tuple[list[Path], Batch]:
        """Each table's rows into a spool file of its own; returns the files written and the rows a
        full or read-only disk refused (`report.spool_error` says why)."""
        files, refused = [], Batch()
        for table, name in _SPOOL_TABLES:
            rows = getattr(batch, name)
            if not len(rows):
                continue
            try:
                path = self.spool.append(table, rows.iter_rows() if name == "metrics" else rows)
            except OSError as exc:
                report.spool_error = self._spool_problem(exc)
                getattr(refused, name).extend(rows)
                continue
            if path is not None:
                files.append(path)
        return files, refused

    def _spool_problem(self, exc: OSError) -> str:
        what = f"[Errno {exc.errno}] {exc.strerror}" if exc.strerror else str(exc)
        return f"spool unwritable: {what}: {self.spool.dir}"

    def _attempt(self, rest: Batch, pending: list) -> dict[str, object]:
        outcome: dict[str, object] = {}

        def attempt() -> None:
            try:
                # the open waits for a busy embedded database, but gives up before the join below does
                with Store(self.dsn, timeout=self.timeout, open_wait=self.open_wait) as store:
                    store.ensure_schema()
                    files: list[FileOutcome] = insert_files(store, pending)
                    outcome["files"] = files
                    outcome["stored"] = store.write_batch(rest)
            except ConfigError as exc:
                outcome["config"] = exc
            except StoreError as exc:
                outcome["error"] = str(exc)
            except Exception as exc:  # any other failure still must not lose the batch
                outcome["error"] = redact(f"{type(exc).__name__}: {exc}")

        worker = threading.Thread(target=attempt, name="stethoscope-write", daemon=True)
        worker.start()
        limit = self.open_wait + self.timeout / 2  # at most the timeout
        worker.join(limit)
        if worker.is_alive():
            # what the thread does from now on is not looked at: it holds no lock and writes no file
            return {"error": f"write did not finish within {limit:g} s", "timed_out": True}
        return outcome


def _set_aside_unfit(batch: Batch) -> None:
    """Move the rows no table can hold into `batch.rejected`, each with its reason."""
    batch.metrics, refused = row_check.split_metrics(batch.metrics)
    unfit = [("metrics", row, reason) for row, reason in refused]
    for table in ("facts", "bench", "fingerprints", "nodes"):
        name = "bench_results" if table == "bench" else table
        kept, refused = row_check.split(name, getattr(batch, table))
        setattr(batch, table, kept)
        unfit += [(name, row, reason) for row, reason in refused]
    batch.rejected += [{"table": table, "reason": reason, "row": row} for table, row, reason in unfit]
