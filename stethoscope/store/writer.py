"""The acknowledged write: into ClickHouse, or else fsynced into the spool. Nothing is dropped.

A write that may hang runs in a thread that talks only to ClickHouse; every spool change (append,
remove, quarantine) is made by the caller's thread, so a thread left behind by a timeout holds no
lock and changes nothing on disk. After a timeout, `spool_only` skips the wait for the rest of a run.

Rows no table can hold (a value that is not a finite number, a time past DateTime64's range) are set
aside in the spool's rejected/ folder before the write, each alone: the rest of the batch is written.
An embedded database held by another process is waited for half the write's timeout, or
STETHOSCOPE_OPEN_WAIT seconds where that is shorter (0: spool at once): a write never takes longer
than its timeout, whatever the environment says.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.paths import default_spool_dir
from stethoscope.store import rows as row_check
from stethoscope.store.batch import Batch
from stethoscope.store.client import Store, StoreError, open_wait_seconds
from stethoscope.store.dsn import ConfigError, redact, resolve_dsn
from stethoscope.store.spool import FileOutcome, ReplayReport, Spool, insert_files


@dataclass
class WriteReport:
    stored: int = 0
    spooled: int = 0
    replayed: int = 0
    rejected: int = 0
    error: str | None = None
    timed_out: bool = False
    problems: list[str] = field(default_factory=list)


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
        if batch.rejected:
            self.spool.reject(batch.rejected)
            report.rejected = len(batch.rejected)
            batch.rejected = []  # kept: whoever handles a failure of this write must not keep them again
        damaged = ReplayReport()
        self.spool.quarantine_damaged(damaged)
        report.problems.extend(damaged.problems)
        # Benchmark results are few and expensive: on disk before anything else is tried.
        bench_files = [
            path
            for path in (
                self.spool.append("bench_results", batch.bench),
                self.spool.append("fingerprints", batch.fingerprints),
            )
            if path is not None
        ]
        rest = Batch(batch.metrics, batch.facts, [], [], batch.nodes)
        if spool_only:
            self.spool.append_batch(rest)
            report.spooled = len(rest) + len(batch.bench) + len(batch.fingerprints)
            report.error = "spooled without trying: the sink timed out earlier in this run"
            return report
        outcome = self._attempt(rest, self.spool.pending_for(self.spool.target))
        if isinstance(outcome.get("config"), ConfigError):
            for path in bench_files:  # a setting to fix, not a sink to wait for: nothing stays spooled
                path.unlink(missing_ok=True)
            raise outcome["config"]  # type: ignore[misc]
        files = outcome.get("files")
        if not isinstance(files, list):
            files = None
        if files is not None:
            replay = ReplayReport()
            self.spool.settle(files, str(self.spool.target), replay)
            fresh = sum(f.rows for f in files if f.path in bench_files and not f.error)  # this batch's
            report.replayed = replay.rows - fresh
            report.problems.extend(replay.problems)
        if "error" in outcome or "stored" not in outcome:
            report.error = str(outcome.get("error", "write failed"))
            report.timed_out = bool(outcome.get("timed_out"))
            # A write that timed out may still land later; the Replacing engines fold the duplicate.
            self.spool.append_batch(rest)
            still_spooled = any(path.exists() for path in bench_files)
            report.spooled = len(rest) + (len(batch.bench) + len(batch.fingerprints) if still_spooled else 0)
        else:
            report.stored = int(outcome["stored"])  # type: ignore[call-overload]
            report.stored += sum(f.rows for f in (files or []) if f.path in bench_files and f.error is None)
        return report

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
