"""What a results file says of the run that wrote it: the commit, the time, the machine and its load,
the command line. Every figure in a results file is from that one run.

Every benchmark writes its results file through `write_results`: the whole file at once (a temp file
renamed over it), the run's stamp at the top level beside its figures, nothing kept from an earlier
file. tests/packaging/test_results_files.py checks that each script does and that each file carries the stamp
(or is listed in benchmarks/results/UNSTAMPED.md with the reason and the command that rewrites it).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
RESULTS = TOP / "benchmarks" / "results"
STAMP_KEYS = ("commit", "at", "command", "machine", "load_average_at_start")


def stamp() -> dict[str, object]:
    return {
        "commit": commit(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def commit() -> str:
    """The checked-out commit, `-dirty` where a tracked file outside benchmarks/results differs from it:
    the results files a run of several benchmarks writes one after another are not code it ran."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        changed = _git(
            "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}-dirty" if changed else head


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(TOP), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


# taken when a benchmark imports this module, that is as it starts
AT_START = stamp()


def write_results(
    path: Path | str,
    figures: Mapping[str, object],
    provenance: Mapping[str, object] | None = None,
    *,
    indent: int = 1,
) -> None:
    """Write `figures` of this run to `path` whole: the stamp (`provenance`, by default the one taken
    as the script started) first, then the figures; atomically, so a reader sees the old file or the
    new one, never half of it or a mix of runs."""
    mark = dict(AT_START if provenance is None else provenance)
    missing = [key for key in STAMP_KEYS if key not in mark]
    if missing:
        raise ValueError(f"the stamp lacks {missing}")
    clash = sorted(set(STAMP_KEYS) & set(figures))
    if clash:
        raise ValueError(f"figures use the stamp's keys {clash}")
    text = json.dumps({**mark, **figures}, indent=indent, default=str) + "\n"
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
