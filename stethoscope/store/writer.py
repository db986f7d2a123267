"""The acknowledged write: into ClickHouse, or else fsynced into the spool. Nothing is dropped."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.paths import default_spool_dir
from stethoscope.store.batch import Batch
from stethoscope.store.client import Store, StoreError
from stethoscope.store.spool import ReplayReport, Spool


@dataclass
class WriteReport:
    stored: int = 0
    spooled: int = 0
    replayed: int = 0
    error: str | None = None
    problems: list[str] = field(default_factory=list)


class Writer:
    """Open, replay the spool, write, close; spool on any failure or when `timeout` runs out."""

    def __init__(self, dsn: str | None = None, spool_dir: str | Path | None = None, timeout: float = 10.0):
        self.dsn = dsn
        self.spool = Spool(spool_dir or default_spool_dir())
        self.timeout = timeout

    def write(self, batch: Batch) -> WriteReport:
        report = WriteReport()
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
        outcome: dict[str, object] = {}

        def attempt() -> None:
            try:
                with Store(self.dsn, timeout=self.timeout) as store:
                    store.ensure_schema()
                    outcome["replay"] = self.spool.replay(store)  # includes bench_files
                    outcome["stored"] = store.write_batch(rest)
            except StoreError as exc:
                outcome["error"] = str(exc)
            except Exception as exc:  # any other failure still must not lose the batch
                outcome["error"] = f"{type(exc).__name__}: {exc}"

        worker = threading.Thread(target=attempt, name="stethoscope-write", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            outcome.setdefault("error", f"write did not finish within {self.timeout:g} s")
        replay = outcome.get("replay")
        if isinstance(replay, ReplayReport):
            report.replayed = replay.rows
            report.problems.extend(replay.problems)
        if "error" in outcome or "stored" not in outcome:
            report.error = str(outcome.get("error", "write failed"))
            # A write that timed out may still land later; the Replacing engines fold the duplicate.
            self.spool.append_batch(rest)
            still_spooled = any(path.exists() for path in bench_files)
            report.spooled = len(rest) + (len(batch.bench) + len(batch.fingerprints) if still_spooled else 0)
        else:
            report.stored = int(outcome["stored"])  # type: ignore[call-overload]
        return report
