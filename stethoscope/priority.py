"""Background work (serve's sweeps and its action playbooks) runs below the operator's commands in
CPU priority: on a controller a 64-host fan-out, or a few evidence and ticket playbooks at once, hold
every core for seconds, and the commands typed beside serve (and serve's own diagnosis) must not wait
behind them. Background work still has every core the moment no one else wants one."""

from __future__ import annotations

import logging
import os
import sys
import threading

log = logging.getLogger(__name__)
BACKGROUND_NICENESS = 10


def lower_thread_priority() -> None:
    """Lower the calling thread's CPU priority to BACKGROUND_NICENESS (never raise it). On Linux a
    niceness belongs to a thread, and the processes it starts inherit it."""
    if sys.platform != "linux":  # elsewhere a niceness is the whole process's: serve's own would drop too
        return
    thread = threading.get_native_id()
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, max(BACKGROUND_NICENESS, niceness))
    except OSError as exc:  # a sandbox that forbids it: the work runs as before
        log.warning("cannot lower a background thread's CPU priority: %s", exc)
