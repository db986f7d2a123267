"""Who holds an embedded database: a small file beside it while a stethoscope process has it open.

ClickHouse allows one process per embedded path and says only "Cannot lock file". The holder file
(`<db>.holder`: pid, command, since) lets a second process say who it waits for; one left by a
process that died is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

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


def unusable_path(path: str) -> str | None:
    """Why `path` cannot be an embedded database folder, or None when it can (it is created here)."""
    target = Path(path)
    if target.exists() and not target.is_dir():
        return "not a database: it is a file, not a folder (give a folder path, e.g. .stethoscope/db)"
    if not target.exists():
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"not a database: the folder cannot be created ({exc.strerror})"
    if not os.access(target, os.W_OK | os.X_OK):
        return "not a database: the folder is not writable by this user"
    return None


class HolderFile:
    def __init__(self, db_path: str):
        self.path = Path(f"{db_path.rstrip('/')}.holder")

    def claim(self) -> None:
        record = {"pid": os.getpid(), "command": _program(), "since": now_ms()}
        part = self.path.with_name(f"{self.path.name}.{os.getpid()}.part")
        try:
            part.write_text(json.dumps(record), encoding="utf-8")
            os.replace(part, self.path)
        except OSError:  # only a courtesy to the next process: the database itself is open
            pass

    def release(self) -> None:
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


def _program() -> str:
    """The program and its subcommand, never its arguments: a DSN or a webhook URL can carry a secret."""
    words = [os.path.basename(sys.argv[0]) if sys.argv else "python"]
    words += [arg for arg in sys.argv[1:3] if arg.isidentifier()][:1]
    return " ".join(words)
