# Copyright: stethoscope developers
# Apache License 2.0
"""A tool run with a time limit and no `timeout` process: the tool leads a process group of its own;
past the limit the group gets SIGTERM, and SIGKILL `grace` seconds later. rc 124 says it ran past the
limit, also where it had to be killed (timeout(1) gave -9 there); 127 and 126 say it could not be
started, as a shell says. No Ansible import (module_glue adapts it).

Not AnsibleModule.run_command under timeout(1), as the collection's other commands run: a sweep runs
nine tools or more, and that took 20 ms of wall time and 5 ms of CPU a run against 2 ms and 1.3 ms
(docs/design.md, "Sweeps per controller"). The rest holds: an argv list of an absolute path, never a
shell string, the C locale, a limit on every run."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess

TIMED_OUT = 124  # timeout(1)'s exit status, which the collectors read as "ran past its limit"


def run_bounded(argv, limit, environ, grace=5):
    """argv (argv[0] a path) -> (rc, stdout, stderr) as text, undecodable bytes kept as surrogates."""
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environ,
            start_new_session=True,
        )
    except OSError as exc:
        rc = 127 if exc.errno == errno.ENOENT else 126
        return rc, "", "%s: %s" % (argv[0], exc.strerror or exc)
    try:
        out, err = process.communicate(timeout=limit)
        return process.returncode, _text(out), _text(err)
    except subprocess.TimeoutExpired:
        # a tool that ended in time while a helper of its own holds its output open keeps its status
        rc = process.poll()
    _signal_group(process, signal.SIGTERM)
    try:
        out, err = process.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        out, err = _drain(process, grace)
    return (TIMED_OUT if rc is None else rc), _text(out), _text(err)


def _drain(process, grace):
    """What the killed tool printed; a process outside its group (a daemon it started) that still holds
    the pipes open is not waited for past `grace`."""
    try:
        return process.communicate(timeout=grace)
    except subprocess.TimeoutExpired as exc:
        for pipe in (process.stdout, process.stderr):
            with contextlib.suppress(OSError):
                pipe.close()
        process.wait()
        return exc.stdout or b"", exc.stderr or b""


def _signal_group(process, signum):
    with contextlib.suppress(OSError):  # ended (and reaped) meanwhile
        os.killpg(process.pid, signum)


def _text(data):
    return (data or b"").decode("utf-8", "surrogateescape")
