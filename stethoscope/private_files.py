"""Folders and files for their owner only: the state folder (the embedded database, the spool,
findings.log, the evidence bundles), the board and the baseline page hold what the nodes reported and
what was done about it. Modes are set explicitly, whatever the umask."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def private_dir(folder: Path) -> Path:
    """`folder`, created 0700 when missing, with each missing parent 0700 too. A folder that exists is
    left as its owner set it (an operator may have opened it to a group on purpose)."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    for path in reversed(missing):
        try:
            path.mkdir(mode=FOLDER_MODE)
        except FileExistsError:
            continue  # made by another process meanwhile: its mode is that one's
        os.chmod(path, FOLDER_MODE)  # mkdir's mode passes through the umask; never wider than 0700
    return folder


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path`, 0600, through a new file renamed over it: a reader never sees half a
    page, and a file an older version left 0644 is 0600 once rewritten."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), FILE_MODE)
            file.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    return path
