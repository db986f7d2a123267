"""bounded_run.run_bounded: a tool's run with a limit (the collectors read rc 124 as "ran past its limit",
127 as "not there"), its whole process group ended, its output kept, never hung by a process that holds
its output open."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bounded_run import TIMED_OUT, run_bounded

SH = "/bin/sh"


def test_a_tool_that_ends_gives_its_status_and_both_streams():
    rc, out, err = run_bounded([SH, "-c", "echo out; echo err >&2; exit 3"], 5, {"PATH": os.defpath})
    assert (rc, out, err) == (3, "out\n", "err\n")


def test_a_tool_past_its_limit_is_ended_with_124_and_what_it_printed_kept():
    began = time.monotonic()
    rc, out = run_bounded([SH, "-c", "echo partial; exec sleep 30"], 0.5, {"PATH": os.defpath})[:2]
    assert (rc, out) == (TIMED_OUT, "partial\n")
    assert time.monotonic() - began < 5


def test_a_tool_that_ignores_sigterm_is_killed_after_the_grace():
    began = time.monotonic()
    rc = run_bounded([SH, "-c", "trap '' TERM; sleep 30; sleep 30"], 0.5, {"PATH": os.defpath}, grace=0.5)[0]
    assert rc == TIMED_OUT
    assert time.monotonic() - began < 5


def test_the_tools_children_end_with_it(tmp_path):
    """A hung tool's helper (a child it started) does not outlive the limit: the group is signalled."""
    pidfile = tmp_path / "child.pid"
    script = f'sleep 30 & echo $! > "{pidfile}"; wait'
    assert run_bounded([SH, "-c", script], 0.5, {"PATH": os.defpath})[0] == TIMED_OUT
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(child), f"the tool's child {child} still runs"


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):  # gone
        return False
    return state != "Z"


def test_bytes_that_are_not_utf8_are_kept_not_refused():
    rc, out = run_bounded([SH, "-c", r"printf 'GPU \377\n'"], 5, {"PATH": os.defpath})[:2]
    assert rc == 0 and out.encode("utf-8", "surrogateescape") == b"GPU \xff\n"


def test_the_environment_is_the_one_given():
    assert run_bounded([SH, "-c", 'echo "$LC_ALL"'], 5, {"PATH": os.defpath, "LC_ALL": "C"})[1] == "C\n"


def test_a_tool_that_cannot_be_started_is_127_or_126_with_the_reason(tmp_path):
    rc, out, err = run_bounded([str(tmp_path / "nvidia-smi")], 5, {})
    assert (rc, out) == (127, "") and "nvidia-smi" in err
    script = tmp_path / "ibstat"
    script.write_text("#!/bin/sh\necho never\n")  # not executable
    rc, out, err = run_bounded([str(script)], 5, {})
    assert (rc, out) == (126, "") and "ibstat" in err


def test_a_helper_that_holds_the_output_open_does_not_hide_the_tools_status():
    """The tool ends at once with 0, a helper of its own keeps its stdout: the tool's status and output
    come back at the limit (the helper ended with the group), not a timeout."""
    rc, out = run_bounded([SH, "-c", "sleep 30 & echo done; exit 0"], 0.5, {"PATH": os.defpath})[:2]
    assert (rc, out) == (0, "done\n")


def test_a_daemon_outside_the_group_that_holds_the_output_does_not_hold_the_run(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    script = f"setsid sh -c 'echo $$ > \"{pidfile}\"; exec sleep 30' & echo started; sleep 30"
    began = time.monotonic()
    try:
        rc, out = run_bounded([SH, "-c", script], 0.5, {"PATH": os.environ["PATH"]}, grace=0.5)[:2]
        assert (rc, out) == (TIMED_OUT, "started\n")
        assert time.monotonic() - began < 5
    finally:
        deadline = time.monotonic() + 5
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        if pidfile.exists() and pidfile.read_text().strip():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
