# Copyright: stethoscope developers
# Apache License 2.0
"""What every collector gets (the node seen through a root prefix, a command runner, a state file)
and what it gives back (facts, metric rows, warnings). No Ansible import: modules adapt to it."""

from __future__ import annotations

import json
import os
import time


class CollectorError(Exception):
    """A collector cannot give a truthful answer; becomes fail_json with the command's output, and
    `collector_failed` rows naming `tool` (argv[0] unless told), `cause` (collector_failure.classify
    when not told) and `device` (the collector's name unless it is one device it could not read)."""

    def __init__(self, msg, cmd=None, rc=None, stdout=None, stderr=None, tool=None, cause=None, device=None):
        super().__init__(msg)
        self.msg = msg
        self.cmd = cmd
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.tool = tool or (cmd[0] if cmd else None)
        self.cause = cause
        self.device = device


class Context:
    """A node as collectors see it.

    run(argv, env=None) -> (rc, stdout, stderr), with argv[0] a tool name resolved by `which` and env
    extra environment variables; rc 124 means the command ran past `timeout`. Paths are absolute as
    on the node and read under `root`.
    """

    def __init__(
        self,
        runner,
        which,
        root="/",
        state_dir="/var/lib/stethoscope",
        check_mode=False,
        timeout=30,
        clock=time.time,
    ):
        self._runner = runner
        self.which = which
        self.root = root or "/"
        self.state_dir = state_dir
        self.check_mode = check_mode
        self.timeout = timeout
        self.now = clock
        self._answers = {}

    def run(self, argv, env=None):
        return self._runner(argv, self.timeout, env)

    def run_once(self, argv, env=None):
        """`run`, but a command this context already ran answers as it did then: a snapshot that several
        parts of one module run read (`nvidia-smi -q -x`: the fingerprint and the GPU collector) is
        taken once."""
        key = (tuple(argv), tuple(sorted((env or {}).items())))
        if key not in self._answers:
            self._answers[key] = self.run(argv, env)
        return self._answers[key]

    def path(self, absolute):
        return os.path.join(self.root, absolute.lstrip("/"))

    def read(self, absolute):
        """File content stripped, or None if it does not exist or cannot be read."""
        try:
            with open(self.path(absolute), encoding="utf-8", errors="replace") as handle:
                return handle.read().strip()
        except (OSError, UnicodeDecodeError):
            return None

    def listdir(self, absolute):
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []

    def exists(self, absolute):
        return os.path.exists(self.path(absolute))

    # the collector's own small state (previous counters, cursors) -------------------------------
    def _state_path(self, name):
        return os.path.join(self.state_dir, "%s.json" % name)

    def load_state(self, name):
        try:
            with open(self._state_path(name), encoding="utf-8") as handle:
                data = json.load(handle)
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def save_state(self, name, data):
        """Bookkeeping, not a change of the node: never `changed`, and not written in check mode."""
        if self.check_mode:
            return
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        target = self._state_path(name)
        tmp = target + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(data, handle, sort_keys=True)
        os.replace(tmp, target)


def run_checked(ctx, argv, tool_label=None, ok_rcs=(0,)):
    """Run and raise CollectorError on a non-zero exit or timeout (never ignored silently)."""
    rc, out, err = ctx.run(argv)
    label = tool_label or " ".join(argv[:3])
    if rc == 124:
        raise CollectorError("%s: timed out after %ss" % (label, ctx.timeout), argv, rc, out, err)
    if rc not in ok_rcs:
        detail = (err or out or "").strip().splitlines()
        raise CollectorError(
            "%s: exit code %s%s" % (label, rc, ": " + detail[0] if detail else ""), argv, rc, out, err
        )
    return out


def result(present, facts=None, metrics=None, warnings=None, **extra):
    data = {"present": present, "facts": facts or {}, "metrics": metrics or [], "warnings": warnings or []}
    data.update(extra)
    return data


def rate(previous, current, elapsed):
    """Per-second rate of a counter between sweeps; None when unknown or the counter was reset."""
    if previous is None or current is None or elapsed <= 0 or current < previous:
        return None
    return (current - previous) / elapsed
