"""One executor at a time per database (docs/design.md "Remediation safety").

On one controller host a flock on a file named after the DSN (password stripped) and the database, in
one private folder for the host's user ($STETHOSCOPE_LOCK_DIR, else `stethoscope-locks-<uid>` in the
system's temp folder, mode 0700 and checked to be the user's own: not beside a spool or state folder,
which two runs may set apart), is held across a whole evaluate -> act -> record cycle (a long-running
executor: its whole life). The file says who holds it: pid and program (`stethoscope serve`), never
arguments, which may carry a DSN's password. Across users of one host and across hosts (a server
DSN) each executor writes a heartbeat row into `executors` every beat (`stethoscope_executor_beat`, a
long-running one on a thread of its own, whatever its cycles' interval); only the oldest live one
(started_at, then host name) acts, and a holder that missed 3 beats is no longer live. Each executor
judges the others by its own beat: the beat is one setting of all the executors of a database
(docs/remediation.md). On its own host a holder whose process is gone is not live at once: a serve
killed with SIGKILL leaves a fresh beat, but the kernel freed its flock, and its successor acts in
its first cycle rather than wait for 3 beats."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from stethoscope.store.client import Store
from stethoscope.store.dsn import ConfigError, redact
from stethoscope.store.holder import pid_alive, program_name
from stethoscope.timeutil import iso, now_ms

MISSED_BEATS = 3
PROCESS_STARTED_MS = now_ms()  # with host and pid, names this process's executor (pids are reused)


class LockHeld(RuntimeError):
    """Another run holds the executor lock of this database."""


def lock_dir() -> Path:
    named = os.environ.get("STETHOSCOPE_LOCK_DIR")
    return Path(named) if named else Path(tempfile.gettempdir()) / f"stethoscope-locks-{os.getuid()}"


def lock_path(dsn: str, database: str) -> Path:
    key = hashlib.sha256(f"{redact(dsn)}|{database}".encode()).hexdigest()[:12]
    return lock_dir() / f"executor-{key}.lock"


def _private_folder(folder: Path) -> None:
    """Create `folder` 0700, or check that it is this user's and nobody else may write in it: a
    folder another user can write lets them plant a link or hold the lock for good."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise ConfigError(
            f"executor lock folder {folder}: must be a folder of this user that no one else may write "
            "(STETHOSCOPE_LOCK_DIR)"
        )


def _holder(fd: int) -> str:
    try:
        record = json.loads(os.pread(fd, 512, 0).decode(errors="replace") or "{}")
    except ValueError:
        return "pid unknown"
    return f"pid {record.get('pid', 'unknown')}: {record.get('program', 'unknown')}"


class ExecutorLock:
    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None
        self.taken_ms = 0  # when this run took it

    def acquire(self) -> ExecutorLock:
        _private_folder(self.path.parent)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise ConfigError(f"executor lock {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise LockHeld(
                f"the executor lock {self.path} of this database is held by another run ({holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "program": program_name()}).encode(), 0)
        self._fd = fd
        self.taken_ms = now_ms()
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> ExecutorLock:
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@dataclass
class Heartbeat:
    """This executor's row in `executors`; `beat` says whether it is the one that acts."""

    beat_seconds: float
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started_ms: int = PROCESS_STARTED_MS
    _version: int = 0
    _writing: threading.Lock = field(default_factory=threading.Lock, repr=False)  # cycles and Beating

    def beat(self, store: Store) -> str:
        """'' when this executor acts; else who does."""
        self._write(store, now_ms())
        for host, pid, started in self._live_rows(store):
            if (host, pid, started) == (self.host, self.pid, self.started_ms):
                return ""  # the flock decided among this user's runs; this decides among users and hosts
            return f"standby: {host} (pid {pid}, executor since {iso(started)}) acts for this database"
        return ""

    def live(self, store: Store) -> set[tuple[str, int, int]]:
        """The executors (host, pid, start) whose heartbeat is live: their in-flight actions are theirs."""
        return set(self._live_rows(store))

    def _live_rows(self, store: Store) -> list[tuple[str, int, int]]:
        """(host, pid, started ms) of the live executors, oldest first; on this host, one whose
        process is gone is not live, whatever its last beat."""
        live_since = now_ms() - int(MISSED_BEATS * self.beat_seconds * 1000)
        rows = store.query(
            "SELECT host, pid, toUnixTimestamp64Milli(started) FROM (SELECT host, pid, "
            "min(started_at) AS started, argMax(beat_at, version) AS beat "
            f"FROM {store.database}.executors GROUP BY host, pid, started_at) "
            "WHERE beat >= fromUnixTimestamp64Milli({live:Int64}, 'UTC') ORDER BY started, host",
            {"live": live_since},
        )
        return [
            (host, int(pid), int(started))
            for host, pid, started in rows
            # on this host, this pid with another start is a predecessor whose pid came back (a container)
            if host != self.host
            or (int(pid) == self.pid and int(started) == self.started_ms)
            or (int(pid) != self.pid and pid_alive(int(pid)))
        ]

    def retire(self, store: Store) -> None:
        """A last row with no live beat: another host may take over at once."""
        self._write(store, 0)

    def keep_alive(self, store: Store) -> None:
        """A beat that only says this executor is live (Beating's, between cycles)."""
        self._write(store, now_ms())

    def _write(self, store: Store, beat_ms: int) -> None:
        with self._writing:
            self._version = max(now_ms(), self._version + 1)
            version = self._version
        store.insert_rows(
            "executors",
            [
                {
                    "host": self.host,
                    "pid": self.pid,
                    "started_at": self.started_ms,
                    "beat_at": beat_ms,
                    "version": version,
                }
            ],
        )


class Beating:
    """Beats a long-running executor's heartbeat every beat on a thread of its own: a cycle an hour
    apart (serve or watch on a long --interval), or one that runs long, must not let a standby count
    it dead and act beside it."""

    def __init__(self, heartbeat: Heartbeat, dsn: str, database: str):
        self.heartbeat, self.dsn, self.database = heartbeat, dsn, database
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="stethoscope-beat", daemon=True)

    def start(self) -> Beating:
        self._thread.start()
        return self

    def stop(self) -> None:
        """No beat after this returns: the retiring row that follows stays the last."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat.beat_seconds):
            try:
                with Store(self.dsn, self.database) as store:
                    self.heartbeat.keep_alive(store)
            except Exception:  # the store down: the cycles report it; a missed beat is what it means
                continue
