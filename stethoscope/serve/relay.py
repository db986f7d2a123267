"""serve's relay: the store's statements of other local processes, answered while serve holds the
embedded database (no other process may open it then).

A unix socket beside the database (`<db>.serve.sock`, mode 0600; nothing listens on TCP), named in the
holder file (store/holder.py) so that Store.open finds it (store/relay_client.py). Only processes of
serve's own user are answered: the kernel tells each peer's uid (SO_PEERCRED). Each connection has a
thread and a reader handle of its own (chdb runs several at once, benchmarks/chdb_threads.py), so a
command's reads do not wait behind the cycle; the handle is made before the connection comes
(serve/spare_readers.py). The wire is store/relay_wire.py; a statement's error
goes back as its text, a broken message gets an error answer and ends only its own connection.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stethoscope.serve.spare_readers import SpareReaders
from stethoscope.store import holder, relay_wire
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import ConfigError, embedded_path, is_embedded

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 3600.0  # a connection with no statement for this long is closed (a stopped peer)
MESSAGE_TIMEOUT = 60.0  # a message begun must arrive whole within this
_SUN_PATH_MAX = 107  # sockaddr_un's path, less its terminating NUL


def peer_allowed(peer_uid: int, own_uid: int | None = None) -> bool:
    """Whether a peer of uid `peer_uid` may use serve's store: only serve's own user (root included
    only when serve runs as root)."""
    return peer_uid == (os.getuid() if own_uid is None else own_uid)


def socket_path_for(db_path: str) -> Path:
    """`<db>.serve.sock` beside the database; where that path is too long for a unix socket, a 0700
    folder of serve's own under the temporary directory."""
    beside = Path(f"{db_path.rstrip('/')}.serve.sock")
    if len(os.fsencode(beside)) <= _SUN_PATH_MAX:
        return beside
    return Path(tempfile.mkdtemp(prefix="stethoscope-relay-")) / "serve.sock"


class Relay:
    def __init__(self, store: Store, documents: Callable[[str], Any] | None = None):
        self.store = store  # serve's open handle: each connection reads through a reader of its own
        self.documents = documents or (lambda name: None)  # name -> what serve publishes (op `published`)
        self.path: Path | None = None
        self._listener: socket.socket | None = None
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._own_folder: Path | None = None  # the temporary folder the socket lies in, if not beside
        self._lock = threading.Lock()  # the connections
        self._making = threading.Lock()  # a reader being made: serve's handle stays open meanwhile
        self._stopping = threading.Event()
        self._spares = SpareReaders(self._reader)

    def start(self) -> Relay:
        """Listen and name the socket in the holder file. OSError when the socket cannot be made;
        nothing to do (and nothing started) with a server DSN, which every process opens itself."""
        if not is_embedded(self.store.dsn):
            return self
        db_path = embedded_path(self.store.dsn)
        path = socket_path_for(db_path)
        if path.is_socket():  # a killed serve's: this process holds the database now
            path.unlink()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(path))
            os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
            listener.listen(64)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        self._listener, self.path = listener, path
        self._own_folder = path.parent if path.parent.name.startswith("stethoscope-relay-") else None
        threading.Thread(target=self._accept, name="stethoscope-relay", daemon=True).start()
        holder.HolderFile(db_path).advertise(str(path))
        self._spares.start()
        return self

    def stop(self, wait: float = 10.0) -> None:
        """Stop answering: the holder file no longer names the socket, the listener and every
        connection close, and their threads end (a statement under way gets up to `wait` seconds)."""
        with self._making, self._lock:  # no reader is made or taken after this: serve's handle closes next
            self._stopping.set()
        self._spares.close(wait)
        if self._listener is None or self.path is None:
            return
        holder.HolderFile(embedded_path(self.store.dsn)).advertise(None)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        with contextlib.suppress(OSError):
            self.path.unlink()
            if self._own_folder is not None:
                self._own_folder.rmdir()
        with self._lock:
            connections = dict(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in connections.values():
            thread.join(wait)

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self._stopping.wait(0.1):
                    return
                continue  # one failed accept (a peer gone at once, no descriptor left) ends no relay
            thread = threading.Thread(target=self._serve, args=(connection,), name="stethoscope-relay-conn")
            thread.daemon = True
            with self._lock:
                if self._stopping.is_set():
                    connection.close()
                    return
                self._connections[connection] = thread
            thread.start()

    def _serve(self, connection: socket.socket) -> None:
        reader: Store | None = None
        try:
            uid = relay_wire.peer_uid(connection)
            if not peer_allowed(uid):
                refusal = StoreError(f"serve's relay answers uid {os.getuid()} only, not uid {uid}")
                relay_wire.send(connection, relay_wire.error_header(refusal))
                return
            connection.settimeout(IDLE_TIMEOUT)
            while not self._stopping.is_set():
                try:
                    message = relay_wire.receive(connection, relay_wire.MAX_REQUEST_BYTES, MESSAGE_TIMEOUT)
                except relay_wire.WireError as exc:  # the stream cannot be followed: answer, then end it
                    relay_wire.send(connection, relay_wire.error_header(StoreError(f"serve's relay: {exc}")))
                    return
                if message is None:
                    return
                if message[0].get("op") == "published":  # serve's own document: no statement, no reader
                    relay_wire.send(connection, *self._published(message[0]))
                    continue
                if reader is None:
                    reader = self._spares.take()
                    if reader is None:
                        return
                header, body = answer(reader, *message)
                relay_wire.send(connection, header, body)
        except OSError:  # the peer went away, or serve stops: only this connection ends
            pass
        except StoreError as exc:  # no reader: the store itself failed
            with contextlib.suppress(OSError):
                relay_wire.send(connection, relay_wire.error_header(exc))
        finally:
            if reader is not None:
                reader.close()
            connection.close()
            with self._lock:
                self._connections.pop(connection, None)

    def _published(self, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        name = request.get("name")
        if not isinstance(name, str):
            return relay_wire.error_header(StoreError("serve's relay: a document is asked by its name")), b""
        document = self.documents(name)  # sent as JSON text: the wire's values are the store's types
        return {"ok": True}, relay_wire.dump_values(None if document is None else json.dumps(document))

    def _reader(self) -> Store | None:
        """A reader handle for one connection; None once serve stops (its handle is about to close)."""
        with self._making:
            return None if self._stopping.is_set() else self.store.reader()


def answer(reader: Store, request: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
    """The reply to one request: the statement run on `reader`, its result or its error."""
    try:
        return {"ok": True}, _run(reader, request, body)
    except (StoreError, ConfigError) as exc:
        return relay_wire.error_header(exc), b""
    except relay_wire.WireError as exc:
        return relay_wire.error_header(StoreError(f"serve's relay: {exc}")), b""
    except Exception as exc:  # serve's own fault: said to the caller, serve goes on
        log.warning("relay: %s: %s", type(exc).__name__, exc)
        return relay_wire.error_header(StoreError(f"serve's relay failed: {type(exc).__name__}: {exc}")), b""


def _run(reader: Store, request: dict[str, Any], body: bytes) -> bytes:
    op = request.get("op")
    if op not in relay_wire.OPS:
        raise relay_wire.WireError(f"unknown request {op!r}")
    values = relay_wire.load_values(body) if body else {}
    if not isinstance(values, dict):
        raise relay_wire.WireError("the values are not a mapping")
    if op == "insert":
        table, names, columns = request.get("table"), request.get("names"), values.get("columns")
        if not isinstance(table, str) or not isinstance(names, list) or not isinstance(columns, list):
            raise relay_wire.WireError("an insert needs a table, its column names and the columns")
        if not all(isinstance(name, str) for name in names):
            raise relay_wire.WireError("column names must be strings")
        reader.insert_columns(table, columns, names)
        return relay_wire.dump_values(None)
    sql, parameters = request.get("sql"), values.get("parameters")
    if not isinstance(sql, str) or not isinstance(parameters, dict | None):
        raise relay_wire.WireError("a statement needs its SQL text and a mapping of parameters")
    if op == "command":
        return relay_wire.dump_values(reader.command(sql, parameters))
    if op == "query":
        return _bounded(relay_wire.dump_values(reader.query(sql, parameters)))
    settings = values.get("settings")
    if not isinstance(settings, dict | None):
        raise relay_wire.WireError("settings must be a mapping")
    return _bounded(_arrow_stream(reader.query_arrow(sql, parameters, settings)))


def _bounded(result: bytes) -> bytes:
    if len(result) > relay_wire.MAX_REPLY_BYTES:
        bound = relay_wire.MAX_REPLY_BYTES
        raise StoreError(f"serve's relay: a result of {len(result)} bytes is over its bound of {bound}")
    return result


def _arrow_stream(table: Any) -> bytes:
    import pyarrow as pa

    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()
