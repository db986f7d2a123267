# Copyright: stethoscope developers
# Apache License 2.0
"""A tool run with a time limit, as `timeout -k GRACE LIMIT` runs it, without a `timeout` process per
run: the tool leads a process group of its own; past the limit the group gets SIGTERM, and SIGKILL
`grace` seconds later; rc 124 says it ran past the limit. No Ansible import (module_glue adapts it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

TIMED_OUT = 124  # timeout(1)'s exit status, which the collectors read as "ran past its limit"


def run_bounded(argv, limit, environ, grace=5):
    """argv (argv[0] a path) -> (rc, stdout, stderr) as text, undecodable bytes kept as surrogates."""
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
        start_new_session=True,
    )
    rc = None
    try:
        out, err = process.communicate(timeout=limit)
        rc = process.returncode
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGTERM)
        try:
            out, err = process.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            out, err = process.communicate()
        rc = TIMED_OUT
    return rc, _text(out), _text(err)


def _signal_group(process, signum):
    with contextlib.suppress(OSError):  # ended (and reaped) meanwhile
        os.killpg(process.pid, signum)


def _text(data):
    return data.decode("utf-8", "surrogateescape")
