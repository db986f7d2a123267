"""The sweeps `serve` runs itself: `collect.yml` through ansible-runner over the inventory at its cadence
(`stethoscope_sweep_interval`), in batches of `stethoscope_sweep_batch` hosts (one ansible-runner
run each, `--limit` to the batch: a batch whose every host is down, a rack, ends no sweep), never
overlapping itself: a sweep still running when the next is due makes that one skipped and
counted. The callback of each sweep writes into the store, or, while serve holds the embedded
database, into the spool serve replays every second."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.priority import BACKGROUND_NICENESS
from stethoscope.remediation.actions.playbook import LOST_EVENTS, PlaybookResult, run_playbook
from stethoscope.store.dsn import ConfigError

log = logging.getLogger(__name__)
PLAYBOOK = "collect.yml"
HOST_STATES = ("ok", "failed", "unreachable")  # how each host of a sweep ended


@dataclass
class SweepStats:
    ok: int = 0  # sweeps whose every host answered
    failed: int = 0  # sweeps with a failed or unreachable host, or that did not run to the end
    skipped: int = 0  # due while the one before was still running
    running: bool = False
    last_seconds: float | None = None
    last_finished: float | None = None  # unix time
    last_hosts: dict[str, int] = field(default_factory=dict)  # HOST_STATES: of the last sweep
    last_error: str | None = None
    durations: deque[float] = field(default_factory=lambda: deque(maxlen=10_000))  # for a p99


def batches(hosts: list[str], batch: str) -> list[list[str]]:
    """`hosts` in batches of `batch`: a count, or a percentage of them (at least 1 host each). A
    value that is neither is a ConfigError (exit 2)."""
    text = str(batch).strip()
    try:
        size = math.ceil(len(hosts) * float(text[:-1]) / 100) if text.endswith("%") else int(text)
    except ValueError:
        size = 0
    if size < 1 and hosts:
        raise ConfigError(f"stethoscope_sweep_batch {batch!r}: a count of hosts or a percentage, like 25%")
    size = max(1, size)
    return [hosts[i : i + size] for i in range(0, len(hosts), size)]


def failed_hosts(results: list[PlaybookResult], hosts: dict[str, str], shown: int = 10) -> str:
    """The hosts a sweep lost, each with what its task said (the first `shown`; the rest counted)."""
    said = {
        event["host"]: f"{event['task']}: {event['msg']}"
        for result in results
        for event in result.events
        if event["event"] in LOST_EVENTS
    }
    lost = sorted(host for host, state in hosts.items() if state != "ok")
    named = [f"{host} ({said[host]})" if host in said else host for host in lost[:shown]]
    more = f" and {len(lost) - shown} more" if len(lost) > shown else ""
    return ", ".join(named) + more if named else "no host named"


class Sweeper:
    def __init__(
        self,
        inventory: Path,
        interval: float,
        envvars: dict[str, str],
        hosts: Sequence[str] = (),
        batch: str = "100%",
        timeout: int | None = None,
        playbook: str = PLAYBOOK,
    ):
        self.inventory, self.interval, self.envvars = inventory, interval, envvars
        self.batches = batches(list(hosts), batch) if hosts else [[]]
        self.playbook = playbook  # under playbooks/, or a path
        self.timeout = timeout or int(max(600, 3 * interval))
        self.stats = SweepStats()
        self.on_done: Callable[[float], None] | None = None  # given each sweep's seconds (serve's /metrics)
        self._stop = threading.Event()
        self._busy = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> Sweeper:
        self._thread = threading.Thread(target=self._schedule, name="stethoscope-sweeps", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: float = 0.0) -> None:
        self._stop.set()
        if self._thread is not None and wait:
            self._thread.join(wait)

    def _schedule(self) -> None:
        """A sweep now, then one every interval on a fixed rate (a slow sweep does not shift the
        cadence): each in a thread of its own, so a due sweep can see the last still running."""
        due = time.monotonic()
        while not self._stop.is_set():
            if not self._busy.acquire(blocking=False):
                self.stats.skipped += 1
                log.warning("sweep: the previous sweep still runs at the next interval: this one is skipped")
            else:
                threading.Thread(target=self._sweep, name="stethoscope-sweep", daemon=True).start()
            due += self.interval
            self._stop.wait(max(0.0, due - time.monotonic()))

    def _sweep(self) -> None:
        started = time.monotonic()
        self.stats.running = True
        try:
            results = []
            for hosts in self.batches:  # a batch whose every host failed does not end the sweep
                if self._stop.is_set():
                    break
                limit = ",".join(hosts) if len(self.batches) > 1 else None
                results.append(
                    run_playbook(
                        self.playbook,
                        self.inventory,
                        limit,
                        {},
                        self.envvars,
                        self.timeout,
                        niceness=BACKGROUND_NICENESS,  # background work: the operator's commands first
                    )
                )
            self._count(results)
        except Exception as exc:  # ansible-runner itself failed: counted, and the next sweep runs
            self.stats.failed += 1
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("sweep: %s", self.stats.last_error)
        finally:
            seconds = time.monotonic() - started
            self.stats.last_seconds = seconds
            self.stats.durations.append(seconds)
            self.stats.last_finished = time.time()
            self.stats.running = False
            self._busy.release()
            if self.on_done is not None:
                self.on_done(seconds)

    def _count(self, results: list[PlaybookResult]) -> None:
        hosts: dict[str, Any] = {}
        for result in results:
            for state in ("ok", "failures", "dark"):
                for host in result.stats.get(state) or {}:
                    hosts[host] = state if state != "ok" else hosts.get(host, "ok")
        self.stats.last_hosts = {
            "ok": sum(1 for s in hosts.values() if s == "ok"),
            "failed": sum(1 for s in hosts.values() if s == "failures"),
            "unreachable": sum(1 for s in hosts.values() if s == "dark"),
        }
        failing = [result for result in results if not result.ok]
        if results and not failing:
            self.stats.ok += 1
            self.stats.last_error = None
        else:
            self.stats.failed += 1
            failed = self.stats.last_hosts["failed"] + self.stats.last_hosts["unreachable"]
            status = f"ansible-runner {failing[0].status} (rc {failing[0].rc})" if failing else "stopped"
            self.stats.last_error = (
                f"{status}: {failed} hosts failed, {len(failing)} of {len(results)} batches"
            )
            log.warning("sweep: %s: %s", self.stats.last_error, failed_hosts(results, hosts))
