"""Who holds an embedded database: a small file beside it while a stethoscope process has it open.

ClickHouse allows one process per embedded path and says only "Cannot lock file". The holder file
(`<db>.holder`: pid, command, since, and `socket` where the holder is serve with its relay) lets a
second process say who it waits for, or reach the store through serve; one left by a process that
died is ignored. One process may open a path several times (serve's cycle and its
collector's writer): the file stays until the last of its handles closes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import threading
import time
from pathlib import Path

from stethoscope.private_files import private_dir
from stethoscope.timeutil import iso, now_ms


def say(message: str) -> None:
    print(f"stethoscope: {message}", file=sys.stderr, flush=True)


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# Errors of the disk under a database folder, not of the path given: they pass (space is freed, the
# disk is remounted writable), so writers spool and retry rather than stop on a setting.
DISK_OUTAGES = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EIO})


def unusable_path(path: str) -> str | None:
    """Why `path` can never be an embedded database folder (a setting to fix), or None when it can
    (it is created here, unless its disk is out: `unwritable_path` says so)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        return "not a database: it is a file, not a folder (give a folder path, e.g. .stethoscope/db)"
    if not target.exists():
        try:
            private_dir(target)  # the raw metrics and findings: its owner's only
        except OSError as exc:
            if exc.errno not in DISK_OUTAGES:
                return f"not a database: the folder cannot be created ({exc.strerror})"
    elif not os.access(target, os.W_OK | os.X_OK) and not _read_only_disk(target):
        # its permissions, on a disk that takes writes: a setting to fix, not an outage that passes
        return "not a database: the folder is not writable by this user"
    return None


def _read_only_disk(target: Path) -> bool:
    return bool(os.statvfs(target).f_flag & os.ST_RDONLY)


def unwritable_path(path: str) -> str | None:
    """Why the database folder at `path` cannot be written now (gone, or its disk read-only): an
    outage that passes, not a setting; None when it can be written."""
    target = Path(path)
    if not target.is_dir():
        try:
            private_dir(target)  # the raw metrics and findings: its owner's only
        except OSError as exc:
            return f"the folder is gone and cannot be created now ({exc.strerror})"
    if os.access(target, os.W_OK | os.X_OK):
        return None
    return "the folder is read-only now (read-only file system)"


_handles: dict[Path, int] = {}  # holder file -> this process's handles open on its database
_handles_lock = threading.Lock()


class HolderFile:
    def __init__(self, db_path: str):
        self.path = Path(f"{db_path.rstrip('/')}.holder")

    def claim(self) -> None:
        with _handles_lock:
            _handles[self.path] = _handles.get(self.path, 0) + 1
            if _handles[self.path] > 1 and self.live_holder() == os.getpid():
                return  # this process's first handle wrote it; it stays until the last one closes
        self._write({"pid": os.getpid(), "command": program_name(), "since": now_ms()})

    def _write(self, record: dict) -> None:
        part = self.path.with_name(f"{self.path.name}.{os.getpid()}.part")
        try:
            part.write_text(json.dumps(record), encoding="utf-8")
            os.replace(part, self.path)
        except OSError:  # only a courtesy to the next process: the database itself is open
            pass

    def advertise(self, socket_path: str | None) -> bool:
        """Name in the file the relay socket through which this process, the holder, answers other
        processes' statements (serve/relay.py); None withdraws it. False when this process holds no
        handle on the database (nothing is written then)."""
        record = self._read()
        if record is None or record["pid"] != os.getpid():
            return False
        record.pop("socket", None)
        if socket_path is not None:
            record["socket"] = socket_path
        self._write(record)
        return True

    def relay_socket(self) -> str | None:
        """The relay socket of the live process that holds the database, unless that is this process
        (its own handles open the path directly) or it advertises none."""
        record = self._read()
        if record is None or record["pid"] == os.getpid() or not pid_alive(record["pid"]):
            return None
        socket_path = record.get("socket")
        return socket_path if isinstance(socket_path, str) and socket_path else None

    def release(self) -> None:
        with _handles_lock:
            left = _handles.get(self.path, 1) - 1
            if left > 0:
                _handles[self.path] = left
                return
            _handles.pop(self.path, None)
        if self.live_holder() == os.getpid():
            with contextlib.suppress(OSError):
                self.path.unlink()

    def _read(self) -> dict | None:
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and isinstance(record.get("pid"), int) else None

    def live_holder(self) -> int | None:
        record = self._read()
        if record is None or not pid_alive(record["pid"]):
            return None
        return int(record["pid"])

    def describe(self) -> str:
        record = self._read()
        if record is None:
            return "another process (it left no holder file: not stethoscope, or an older version)"
        if not pid_alive(record["pid"]):
            return f"another process (the holder file of pid {record['pid']} is stale: that process is gone)"
        since = iso(record["since"]) if isinstance(record.get("since"), int) else "?"
        return f"pid {record['pid']} ({record.get('command') or '?'}, since {since})"

    def wait_released(self, seconds: float) -> None:
        """Sleep up to `seconds`, returning early once a live holder lets go."""
        deadline = time.monotonic() + seconds
        held = self.live_holder() not in (None, os.getpid())
        while time.monotonic() < deadline:
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
            if held and self.live_holder() is None:
                return


def program_name() -> str:
    """`stethoscope <subcommand>` for the CLI, else `stethoscope in <program>` (the callback in
    ansible-playbook); never arguments: a DSN or a webhook URL can carry a secret."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if name == "stethoscope" or argv0.endswith(os.path.join("stethoscope", "cli", "__main__.py")):
        return f"stethoscope {_subcommand(sys.argv[1:])}".strip()
    return f"stethoscope in {'python -c' if name in ('-c', '') else name}"


def _subcommand(args: list[str]) -> str:
    """The first word that is no option nor an option's value (the global options before it take one,
    but --debug)."""
    words = iter(args)
    for arg in words:
        if not arg.startswith("-"):
            return arg if arg.isidentifier() else ""
        if arg != "--debug" and "=" not in arg:
            next(words, None)
    return ""
