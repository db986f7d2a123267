"""Background work (serve's sweeps, its evidence, ticket and re-baseline playbooks) runs below the
operator's commands in CPU priority: on a controller a 64-host fan-out, or a few playbooks at once,
hold every core for seconds, and the commands typed beside serve must not wait behind them. Only the
ansible-playbook process (and the forks and modules it starts) is lowered, never a thread of serve:
a drain's playbook, serve's diagnosis and the reader of a playbook's output keep their priority.
Background work still has every core the moment no one else wants one.

Where the kernel shares CPU time between sessions before it weighs niceness (autogroup, on by default
in Debian's and Ubuntu's kernels), a niceness counts only inside its own session, and each of a
playbook's processes that does the work leads a session of its own: ansible-runner starts
ansible-playbook on a terminal of its own, and every fork of ansible-playbook (a worker: the host's
connection, its module on a local host) calls os.setsid. At their groups' niceness 0 a sweep's 16
workers took as much CPU each as the operator's whole shell. So the launcher runs ansible-playbook
through BOOTSTRAP, which lowers its own session's group (only when it leads that session: never
serve's) and wraps os.setsid so that each new session's group takes the process's niceness. An
ansible-playbook that is no Python script (a binary shim) gets its niceness only."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

BACKGROUND_NICENESS = 19
# run as `python niced_sessions.py <ansible-playbook> ARGS...`: the playbook's sessions take its niceness
BOOTSTRAP = """# written by stethoscope (stethoscope/priority.py)
import os, runpy, sys
def lower():  # this session's group takes this process's niceness
    try:
        with open("/proc/self/autogroup", "w") as group:
            group.write(str(os.nice(0)))
    except OSError:
        pass
_setsid = os.setsid
def setsid():
    _setsid()
    lower()
os.setsid = setsid
if os.getsid(0) == os.getpid():  # ansible-runner's terminal: a session of its own
    lower()
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def niced_path(folder: str | Path, niceness: int, path: str) -> str:
    """A PATH whose first folder (made in `folder`) holds an `ansible-playbook` that runs the one of
    `path` at `niceness`: ansible-runner starts `ansible-playbook` by name, from its PATH. The
    launcher holds only that int, that file's path and its Python's (through BOOTSTRAP, beside it, which
    lowers each session it starts). `path` itself when none is found there."""
    real = shutil.which("ansible-playbook", path=path)
    if real is None:
        return path
    launchers = Path(folder) / "niced-bin"
    launchers.mkdir(mode=0o700)
    launcher = launchers / "ansible-playbook"
    python = _interpreter(Path(real))
    bootstrap = launchers / "niced_sessions.py"
    bootstrap.write_text(BOOTSTRAP, encoding="utf-8")
    run = [python, str(bootstrap), real] if python else [real]
    script = f'#!/bin/sh\nexec nice -n {int(niceness)} {shlex.join(run)} "$@"\n'
    launcher.write_text(script, encoding="utf-8")
    os.chmod(launcher, 0o700)
    return os.pathsep.join([str(launchers), path])


def _interpreter(script: Path) -> str | None:
    """The Python a script's `#!` line names, None where it names none (a binary, a shim)."""
    try:
        with script.open("rb") as file:
            first = file.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    if len(words) == 2 and Path(words[0]).name == "env":  # #!/usr/bin/env python3
        words = [shutil.which(words[1]) or ""]
    if len(words) == 1 and Path(words[0]).name.startswith("python"):
        return words[0]
    return None
