"""The store a running `serve` holds, reached through its relay socket (store/relay_wire.py).

While serve holds an embedded database, no other process may open it; serve answers that process's
statements instead. RelayClient stands where clickhouse-connect's client stands in Store (the same four
calls), so every command works beside serve unchanged: a statement's error comes back as the error it
raised in serve (StoreError, SchemaMissing, ConfigError: the same message as direct).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from stethoscope.store import relay_wire
from stethoscope.store.dsn import ConfigError
from stethoscope.store.errors import SchemaMissing, StoreError

CONNECT_TIMEOUT = 5.0
REPLY_TIMEOUT = 600.0  # a statement's own time: a long scan through serve takes what it takes direct
RECONNECT_IDLE = 1800.0  # a connection idle this long is made anew (serve's relay closes it at an hour)

_ERRORS: dict[str, type[Exception]] = {
    "StoreError": StoreError,
    "SchemaMissing": SchemaMissing,
    "ConfigError": ConfigError,
}


class Rows:
    """What `query` returns: clickhouse-connect's result, as far as Store reads it."""

    def __init__(self, result_rows: list[tuple]):
        self.result_rows = result_rows


class RelayClient:
    def __init__(self, socket_path: str, serve: str, timeout: float = REPLY_TIMEOUT):
        """Connected to serve's relay at `socket_path`; `serve` names it in messages (pid, program).
        OSError when nothing answers there (serve just stopped): the caller opens the path itself."""
        self.socket_path, self.serve, self.timeout = socket_path, serve, timeout
        self._lock = threading.Lock()  # one statement at a time on a connection, as on a chdb handle
        self._sock = self._connect()
        self._used = time.monotonic()

    def _connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_TIMEOUT)
            sock.connect(self.socket_path)
            if relay_wire.peer_uid(sock) != os.getuid():  # never hand statements to another user
                raise PermissionError(f"{self.socket_path}: the relay there runs as another user")
            sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        return sock

    def command(self, sql: str, parameters: dict[str, Any] | None = None) -> Any:
        return self._ask({"op": "command", "sql": sql}, {"parameters": parameters})

    def query(self, sql: str, parameters: dict[str, Any] | None = None) -> Rows:
        return Rows(self._ask({"op": "query", "sql": sql}, {"parameters": parameters}))

    def query_arrow(
        self, sql: str, parameters: dict[str, Any] | None = None, settings: dict[str, Any] | None = None
    ) -> Any:
        import pyarrow as pa

        values = {"parameters": parameters, "settings": settings}
        stream = self._ask({"op": "query_arrow", "sql": sql}, values)
        return pa.ipc.open_stream(stream).read_all()

    def insert(
        self,
        table: str,
        data: Sequence[Sequence[Any]],
        column_names: Sequence[str],
        column_oriented: bool = True,
    ) -> None:
        if not column_oriented:
            raise ValueError("the relay carries column-oriented inserts only")
        self._ask({"op": "insert", "table": table, "names": list(column_names)}, {"columns": list(data)})

    def published(self, name: str) -> Any:
        """A document serve publishes under `name` (its latest evaluation) as JSON text; None if none."""
        return self._ask({"op": "published", "name": name}, {})

    def close(self) -> None:
        self._sock.close()

    def _ask(self, header: dict[str, Any], values: dict[str, Any]) -> Any:
        body = relay_wire.dump_values(values)  # a value pickle cannot carry fails here, as direct
        with self._lock:
            try:
                if time.monotonic() - self._used > RECONNECT_IDLE:  # before serve closes it as idle
                    self._sock.close()
                    self._sock = self._connect()
                relay_wire.send(self._sock, header, body)
                reply = relay_wire.receive(self._sock, relay_wire.MAX_REPLY_BYTES)
            except (relay_wire.WireError, OSError) as exc:
                self._sock.close()
                raise StoreError(f"{self.serve} stopped answering: {exc}") from None
            finally:
                self._used = time.monotonic()
        if reply is None:
            self._sock.close()
            raise StoreError(f"{self.serve} closed the connection (it is stopping)")
        answer, result = reply
        if not answer.get("ok"):
            error = _ERRORS.get(str(answer.get("kind")), StoreError)
            message = str(answer.get("error") or "the statement failed")
            if error is StoreError:
                raise StoreError(message, data_fault=bool(answer.get("data_fault")))
            raise error(message)
        if header["op"] == "query_arrow":
            return result
        try:
            return relay_wire.load_values(result)
        except relay_wire.WireError as exc:
            raise StoreError(f"{self.serve} answered with {exc}") from None
