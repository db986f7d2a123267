"""What a results file says of the run that wrote it: the commit, the time, the machine and its load,
the command line. Every figure in a results file is from that one run."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]


def stamp() -> dict[str, object]:
    try:
        commit = subprocess.run(
            ["git", "-C", str(TOP), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "commit": commit,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }
