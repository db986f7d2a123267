"""Background work (serve's sweeps, its evidence, ticket and re-baseline playbooks) runs below the
operator's commands in CPU priority: on a controller a 64-host fan-out, or a few playbooks at once,
hold every core for seconds, and the commands typed beside serve must not wait behind them. Only the
ansible-playbook process (and the forks and modules it starts) is lowered, never a thread of serve:
a drain's playbook, serve's diagnosis and the reader of a playbook's output keep their priority.
Background work still has every core the moment no one else wants one."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

BACKGROUND_NICENESS = 19


def niced_path(folder: str | Path, niceness: int, path: str) -> str:
    """A PATH whose first folder (made in `folder`) holds an `ansible-playbook` that runs the one of
    `path` at `niceness`: ansible-runner starts `ansible-playbook` by name, from its PATH. The
    launcher holds only that int and that file's path. `path` itself when none is found there."""
    real = shutil.which("ansible-playbook", path=path)
    if real is None:
        return path
    launchers = Path(folder) / "niced-bin"
    launchers.mkdir(mode=0o700)
    launcher = launchers / "ansible-playbook"
    script = f'#!/bin/sh\nexec nice -n {int(niceness)} {shlex.quote(real)} "$@"\n'
    launcher.write_text(script, encoding="utf-8")
    os.chmod(launcher, 0o700)
    return os.pathsep.join([str(launchers), path])
