"""The relay's wire: how another local process talks to the store a running `serve` holds.

A message is two frames, a JSON header and a body of bytes; a frame is its length (8 bytes, big-endian)
then its bytes, bounded in size. A request's header names the statement (`op`, `sql`, for an insert
`table` and `names`); its body carries the values (parameters, settings, inserted columns). A reply's
header says `ok`, or carries the error for the caller to raise again (`error`, `kind`, `data_fault`);
its body is the result: Python values, or Arrow IPC stream bytes for `query_arrow`.

Values travel as pickles so that datetimes, Decimals, UUIDs, maps and arrays round-trip exactly, and
are read back by an Unpickler that builds only the plain value types below: a frame never runs code.
"""

from __future__ import annotations

import io
import json
import pickle
import socket
import struct
from typing import Any

MAX_REQUEST_BYTES = 256 * 1024 * 1024  # one statement's values: a large insert fits, a runaway does not
MAX_REPLY_BYTES = 1024 * 1024 * 1024  # one result, from serve (this user's own process)
_LENGTH = struct.Struct(">Q")
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid

OPS = frozenset({"command", "query", "query_arrow", "insert", "published"})  # published: serve's documents

# The only classes a body may name: the values clickhouse-connect takes and returns.
_ALLOWED = frozenset(
    {
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "complex"),
        ("builtins", "bytearray"),
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
        ("uuid", "UUID"),
        ("ipaddress", "IPv4Address"),
        ("ipaddress", "IPv6Address"),
        ("zoneinfo", "ZoneInfo._unpickle"),
        ("zoneinfo._zoneinfo", "ZoneInfo._unpickle"),
        ("stethoscope.store.relay_wire", "plain_value"),
        # what `command` returns for a statement without a result (its counters, a dict)
        ("clickhouse_connect.driver.summary", "QuerySummary"),
    }
)


class WireError(Exception):
    """The peer broke the protocol, went away or sent more than the bound: the connection ends."""


class _ValuesOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not a value the relay carries")
        return super().find_class(module, name)


def plain_value(value: Any) -> Any:
    """What a numpy value becomes on the wire: its plain Python value (`tolist`), rebuilt as itself."""
    return value


class _PlainValues(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        # a model's score (numpy.float64) or array: clickhouse-connect takes them, the wire carries
        # their plain values (the unpickler builds no numpy object)
        if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
            return plain_value, (obj.tolist(),)
        # a subclass of a plain type (Ansible's tagged strings: an inventory's host names) goes as it
        for plain in (str, int, float):
            if isinstance(obj, plain) and type(obj) not in (plain, bool):
                return plain_value, (plain(obj),)
        return NotImplemented


def dump_values(values: Any) -> bytes:
    buffer = io.BytesIO()
    _PlainValues(buffer, protocol=5).dump(values)
    return buffer.getvalue()


def load_values(data: bytes) -> Any:
    """Values from a body; a class outside the plain value types raises WireError, nothing is built."""
    try:
        return _ValuesOnly(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed body: a protocol error, never a crash of the reader
        raise WireError(f"unreadable values: {exc}") from None


def send(sock: socket.socket, header: dict[str, Any], body: bytes = b"") -> None:
    head = json.dumps(header).encode()
    sock.sendall(b"".join((_LENGTH.pack(len(head)), head, _LENGTH.pack(len(body)))))
    if body:
        sock.sendall(body)


Message = tuple[dict[str, Any], bytes]  # a header and a body


def receive(sock: socket.socket, limit: int, within: float | None = None) -> Message | None:
    """The next message (header, body), or None when the peer closed between messages. It may wait the
    socket's own timeout to start; once started, with `within`, the rest must come within that many
    seconds (a peer that stops halfway is dropped sooner than an idle one)."""
    waited = sock.gettimeout()
    prefix = _exactly(sock, _LENGTH.size, may_end=True)
    if prefix is None:
        return None
    if within is not None:
        sock.settimeout(within)
    try:
        head = _rest(sock, prefix, limit)
        body = _rest(sock, _exactly(sock, _LENGTH.size, may_end=False) or b"", limit)
    finally:
        sock.settimeout(waited)
    try:
        header = json.loads(head)
    except ValueError:
        raise WireError("the header is not JSON") from None
    if not isinstance(header, dict):
        raise WireError("the header is not a JSON object")
    return header, body


def _rest(sock: socket.socket, prefix: bytes, limit: int) -> bytes:
    """A frame's bytes, its length prefix read."""
    (length,) = _LENGTH.unpack(prefix)
    if length > limit:
        raise WireError(f"a frame of {length} bytes is over the relay's bound of {limit} bytes")
    return _exactly(sock, length, may_end=False) or b""


def _exactly(sock: socket.socket, size: int, may_end: bool) -> bytes | None:
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        try:
            count = sock.recv_into(view[got:], size - got)
        except TimeoutError:
            raise WireError("the peer stopped sending (timed out)") from None
        except OSError as exc:
            raise WireError(f"the connection failed: {exc.strerror or exc}") from None
        if count == 0:
            if may_end and got == 0:
                return None
            raise WireError("the peer closed the connection in the middle of a message")
        got += count
    return bytes(buffer)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected unix socket, as the kernel tells it."""
    credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    return int(_CREDENTIALS.unpack(credentials)[1])


def error_header(exc: Exception) -> dict[str, Any]:
    """A reply that carries `exc` (a StoreError, SchemaMissing or ConfigError) for the caller to raise."""
    return {
        "ok": False,
        "error": str(exc),
        "kind": type(exc).__name__,
        "data_fault": bool(getattr(exc, "data_fault", False)),
    }
