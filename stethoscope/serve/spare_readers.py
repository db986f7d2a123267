"""Reader handles made before the relay's connections ask for them. Making one (clickhouse-connect's
client on chdb reads the server's settings as it connects) cost a command's first statement 50 ms at
the median and up to 3 s while serve's cycle, collector and playbooks held the cores; taken ready-made,
it costs nothing, and a replacement is made in the background."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from stethoscope.store.client import Store
from stethoscope.store.dsn import redact

log = logging.getLogger(__name__)


class SpareReaders:
    def __init__(self, make: Callable[[], Store | None], keep: int = 2):
        self._make, self._keep = make, keep  # make: a new reader, None once serve stops
        self._ready: list[Store] = []
        self._lock = threading.Lock()
        self._wanted = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._refill, name="stethoscope-relay-spares", daemon=True)

    def start(self) -> SpareReaders:
        self._wanted.set()
        self._thread.start()
        return self

    def take(self) -> Store | None:
        """A ready reader, else one made now (StoreError where the store fails); None once closed or
        serve stops."""
        with self._lock:
            if self._closed:
                return None
            spare = self._ready.pop() if self._ready else None
        self._wanted.set()
        return spare if spare is not None else self._make()

    def close(self, wait: float = 10.0) -> None:
        """Close the spares; none is made after this."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, []
        self._wanted.set()
        if self._thread.is_alive():
            self._thread.join(wait)
        for reader in ready:
            reader.close()

    def _refill(self) -> None:
        while not self._closed:
            self._wanted.wait()
            self._wanted.clear()
            while self._missing():
                try:
                    made = self._make()
                except Exception as exc:  # the next connection makes its own and says why
                    log.warning("relay: no spare reader: %s", redact(str(exc)))
                    break
                if made is None:
                    return
                with self._lock:
                    kept = not self._closed
                    if kept:
                        self._ready.append(made)
                if not kept:
                    made.close()
                    return

    def _missing(self) -> bool:
        with self._lock:
            return not self._closed and len(self._ready) < self._keep
