"""Where a long-running executor's actions run (`serve --execute`): a pool of threads beside the
diagnosis cycle, so that playbooks never hold a cycle up. One incident's work runs in order, after
the work of that incident queued before it; different incidents run in parallel
(`stethoscope_executor_parallel`). When every worker is busy, an incident whose work isolates a node
(`first`) starts before incidents queued earlier that do not: a node to drain waits for no backlog of
tickets and alerts, and keeps taking jobs no longer than it must. While an incident has work queued
or running, the cycle knows which actions it has planned (`busy`) and does not plan them again."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class ActionPool:
    def __init__(self, workers: int):
        self._threads = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="actions")
        self._guard = threading.Lock()
        self._idle = threading.Condition(self._guard)
        self._queues: dict[str, deque[tuple[frozenset[str], Callable[[], None]]]] = {}
        # incidents waiting for a worker, the ones marked `first` ahead, then in their order
        self._waiting: list[tuple[int, int, str]] = []
        self._order = itertools.count()

    def busy(self) -> dict[str, frozenset[str]]:
        """Incidents with work queued or running -> the actions that work has planned."""
        with self._guard:
            return {
                txn: frozenset().union(*(labels for labels, _ in queue))
                for txn, queue in self._queues.items()
            }

    def submit(
        self, txn_id: str, labels: Collection[str], work: Callable[[], None], *, first: bool = False
    ) -> None:
        """Run `work` after the work of `txn_id` queued before it; an incident given work marked
        `first` goes ahead of the incidents still waiting for a worker (itself too, if it waits)."""
        with self._guard:
            queue = self._queues.get(txn_id)
            if queue is not None:
                queue.append((frozenset(labels), work))
                if first:
                    self._move_ahead(txn_id)
                return
            self._queues[txn_id] = deque([(frozenset(labels), work)])
            heapq.heappush(self._waiting, (0 if first else 1, next(self._order), txn_id))
        self._threads.submit(self._run_next)

    def _move_ahead(self, txn_id: str) -> None:
        """`txn_id`, if it still waits for a worker, among the incidents marked `first`."""
        for index, (rank, order, waiting) in enumerate(self._waiting):
            if waiting == txn_id and rank:
                self._waiting[index] = (0, order, txn_id)
                heapq.heapify(self._waiting)
                return

    def _run_next(self) -> None:
        """One task per incident submitted: whichever incident waits first when a worker frees."""
        with self._guard:
            if not self._waiting:  # dropped by close() before a worker took it
                return
            _, _, txn_id = heapq.heappop(self._waiting)
        self._run(txn_id)

    def _run(self, txn_id: str) -> None:
        while True:
            with self._guard:
                _, work = self._queues[txn_id][0]
            try:
                work()
            except Exception:  # recorded by the work itself where it could be; never lost silently
                log.exception("actions of incident %s", txn_id)
            with self._guard:
                queue = self._queues[txn_id]
                queue.popleft()
                if not queue:
                    del self._queues[txn_id]
                    self._idle.notify_all()
                    return

    def pending(self) -> int:
        with self._guard:
            return len(self._queues)

    def close(self, timeout: float | None = None) -> bool:
        """Drop the work not started (its `planned` rows stay for the next executor) and let the
        running work finish (up to `timeout` seconds); True when none is left."""
        with self._guard:
            for _, _, waiting in self._waiting:  # no worker took these: nothing of theirs runs
                del self._queues[waiting]
            self._waiting.clear()
            for queue in self._queues.values():
                while len(queue) > 1:  # the first is running
                    queue.pop()
            self._idle.notify_all()
            self._idle.wait_for(lambda: not self._queues, timeout)
            left = bool(self._queues)
        self._threads.shutdown(wait=not left)
        return not left
