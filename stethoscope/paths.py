"""Where the project keeps its embedded database, spool and lab state."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The project folder: $STETHOSCOPE_HOME, else the checkout this package lives in, else cwd."""
    env = os.environ.get("STETHOSCOPE_HOME")
    if env:
        return Path(env).resolve()
    here = Path(__file__).resolve().parent.parent
    if (here / "collections" / "stethoscope").is_dir():
        return here
    return Path.cwd().resolve()


def state_dir() -> Path:
    return project_root() / ".stethoscope"


def default_db_path() -> Path:
    return state_dir() / "db"


def default_spool_dir() -> Path:
    return Path(os.environ.get("STETHOSCOPE_SPOOL_DIR") or state_dir() / "spool")
