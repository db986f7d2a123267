"""The 5-second stream's datagram (docs/design.md "Telemetry"): one UDP packet per (node, part, sample).

Standard library only and Python 3.8-compatible: the push_agent role copies this file to the nodes.

Layout, network byte order, at most 128 bytes:

    magic "S5" | version u8 | part u8 | set id u16 | node key u16 | boot epoch u32 | seq u32 |
    timestamp ms u64 | job u32 | rank u16 | count u8 | flags u8 |  count x float32 (NaN = missing) |
    HMAC-SHA256(node key, everything before it)[:16]

Part 0 is the node's core metrics, parts 1..N the GPUs (part k is gpu k-1), JOB_PART a training
job's (job and rank set, flag JOB_NUMERIC when `job` is the job id itself rather than its CRC32).
Each node signs with its own key, HMAC(cluster secret, node_id); the decoder returns a Sample or a
Rejection with its reason and never raises, whatever bytes it is given. A value that is ±Inf (a
buggy reading, or a hostile node) is never handed on: it arrives as NaN (missing), and the Sample
counts it (`nonfinite`), so that one bad value costs itself only, never its datagram's neighbours.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import struct
import zlib
from typing import Callable, NamedTuple, Optional, Sequence

MAGIC = b"S5"
VERSION = 1
MAX_VALUES = 20
MAX_DATAGRAM = 128
MAC_BYTES = 16
NODE_PART = 0
JOB_PART = 255
JOB_NUMERIC = 0x01
REDUNDANCY = 3  # each period re-sends the previous 3 samples
FRESHNESS_MS = 60_000

_HEADER = struct.Struct("!2sBBHHIIQIHBB")
HEADER_BYTES = _HEADER.size  # 32
assert HEADER_BYTES + 4 * MAX_VALUES + MAC_BYTES <= MAX_DATAGRAM

# Rejection reasons: the collector counts datagrams per reason, never per claimed node.
SHORT, LENGTH, MAGIC_REASON, VERSION_REASON = "short", "length", "magic", "version"
SET, KEY, MAC, STALE, REPLAYED = "set", "key", "mac", "stale", "replayed"
REASONS = (SHORT, LENGTH, MAGIC_REASON, VERSION_REASON, SET, KEY, MAC, STALE, REPLAYED)


class Header(NamedTuple):
    version: int
    part: int
    set_id: int
    node_key: int
    boot_epoch: int
    seq: int
    ts_ms: int
    job: int
    rank: int
    n_values: int
    flags: int


class Sample(NamedTuple):
    header: Header
    values: tuple[float, ...]  # NaN: missing (sent so, or ±Inf refused)
    nonfinite: int = 0  # values that were ±Inf, refused

    @property
    def stream(self) -> tuple[int, int, int, int]:
        """What one sequence of samples belongs to: (node key, part, job, rank)."""
        h = self.header
        return (h.node_key, h.part, h.job, h.rank)


class Rejection(NamedTuple):
    reason: str
    detail: str = ""


def node_secret(cluster_secret: bytes, node_id: str) -> bytes:
    """The key one node holds: HMAC(cluster secret, node_id)."""
    return hmac.new(cluster_secret, node_id.encode("utf-8"), hashlib.sha256).digest()


def job_field(job_id: str) -> tuple[int, int]:
    """(job, flags) for a job id: Slurm's numeric ids travel as themselves, others as their CRC32."""
    text = str(job_id)
    if text.isdigit() and int(text) < 2**32:
        return int(text), JOB_NUMERIC
    return zlib.crc32(text.encode("utf-8")), 0


_FLOAT32 = struct.Struct("!f")


def job_label(job: int, flags: int) -> str:
    return str(job) if flags & JOB_NUMERIC else "crc32:%08x" % job


def encode(
    key: bytes,
    *,
    set_id: int,
    node_key: int,
    part: int,
    boot_epoch: int,
    seq: int,
    ts_ms: int,
    values: Sequence[float | None],
    job: int = 0,
    rank: int = 0,
    flags: int = 0,
) -> bytes:
    """One datagram. None and NaN travel as NaN (missing); values float32 cannot hold become NaN."""
    if len(values) > MAX_VALUES:
        raise ValueError("at most %d values per datagram, not %d" % (MAX_VALUES, len(values)))
    floats = []
    for value in values:
        number = math.nan if value is None else float(value)
        try:
            _FLOAT32.pack(number)
        except OverflowError:
            number = math.nan
        floats.append(number)
    body = _HEADER.pack(
        MAGIC,
        VERSION,
        part,
        set_id,
        node_key,
        boot_epoch,
        seq,
        ts_ms,
        job,
        rank,
        len(floats),
        flags,
    ) + struct.pack("!%df" % len(floats), *floats)
    return body + hmac.new(key, body, hashlib.sha256).digest()[:MAC_BYTES]


def parse_header(data: bytes) -> Header | Rejection:
    """The header, checked for shape only (no key is needed yet): magic, version, exact length."""
    if len(data) < HEADER_BYTES + MAC_BYTES:
        return Rejection(SHORT, "%d bytes" % len(data))
    if len(data) > MAX_DATAGRAM:
        return Rejection(LENGTH, "%d bytes" % len(data))
    fields = _HEADER.unpack_from(data)
    if fields[0] != MAGIC:
        return Rejection(MAGIC_REASON)
    header = Header(*fields[1:])
    if header.version != VERSION:
        return Rejection(VERSION_REASON, "version %d" % header.version)
    expected = HEADER_BYTES + 4 * header.n_values + MAC_BYTES
    if header.n_values > MAX_VALUES or len(data) != expected:
        return Rejection(LENGTH, "%d values in %d bytes" % (header.n_values, len(data)))
    return header


def verify(data: bytes, keys: Sequence[bytes]) -> bool:
    """Whether the datagram's MAC matches one of the keys (current and previous secret)."""
    body, mac = data[:-MAC_BYTES], data[-MAC_BYTES:]
    return any(
        hmac.compare_digest(hmac.new(key, body, hashlib.sha256).digest()[:MAC_BYTES], mac) for key in keys
    )


def values_of(data: bytes, header: Header) -> tuple[float, ...]:
    return struct.unpack_from("!%df" % header.n_values, data, HEADER_BYTES)


KeyLookup = Callable[[int], Optional[Sequence[bytes]]]


def decode(
    data: bytes,
    keys_of: KeyLookup,
    now_ms: int,
    known_sets: Callable[[int], bool] | None = None,
    freshness_ms: int = FRESHNESS_MS,
) -> Sample | Rejection:
    """A Sample, or a Rejection saying why not: shape, version, set, node key, MAC, freshness."""
    header = parse_header(data)
    if isinstance(header, Rejection):
        return header
    return authenticate(data, header, keys_of, now_ms, known_sets, freshness_ms)


def authenticate(
    data: bytes,
    header: Header,
    keys_of: KeyLookup,
    now_ms: int,
    known_sets: Callable[[int], bool] | None = None,
    freshness_ms: int = FRESHNESS_MS,
) -> Sample | Rejection:
    if known_sets is not None and not known_sets(header.set_id):
        return Rejection(SET, "set %d" % header.set_id)
    keys = keys_of(header.node_key)
    if not keys:
        return Rejection(KEY)
    if not verify(data, keys):
        return Rejection(MAC)
    if abs(header.ts_ms - now_ms) > freshness_ms:
        return Rejection(STALE, "%+d ms" % (header.ts_ms - now_ms))
    values = values_of(data, header)
    infinite = sum(1 for value in values if math.isinf(value))
    if infinite:
        values = tuple(math.nan if math.isinf(value) else value for value in values)
    return Sample(header, values, infinite)


class SequenceGuard:
    """Per stream: keep each (boot epoch, seq) once, refuse old ones, count samples no copy delivered.

    A sample is lost once a sequence REDUNDANCY + 1 ahead of it has arrived and it has not: no copy
    of it will be sent again. An older boot epoch, or a sequence behind that horizon, is a replay.
    """

    def __init__(self, redundancy: int = REDUNDANCY):
        self.redundancy = redundancy
        # stream -> [boot epoch, highest seq, lowest seq seen in this epoch, seqs seen in the horizon,
        # newest timestamp in ms]
        self._state: dict[tuple[int, int, int, int], list] = {}
        self.lost: dict[int, int] = {}  # node key -> samples lost

    def check(self, header: Header) -> str | None:
        """None for a new sample, "duplicate" for a copy already kept, REPLAYED for an old one."""
        state = self._state.get((header.node_key, header.part, header.job, header.rank))
        if state is None:
            return None
        epoch, high, _low, seen, _newest = state
        if header.boot_epoch != epoch:
            return REPLAYED if header.boot_epoch < epoch else None
        if header.seq in seen:
            return "duplicate"
        if header.seq + self.redundancy < high:
            return REPLAYED
        return None

    def accept(self, header: Header) -> None:
        """Record a sample check() called new (after its MAC was verified)."""
        stream = (header.node_key, header.part, header.job, header.rank)
        state = self._state.get(stream)
        if state is None or header.boot_epoch > state[0]:
            self._state[stream] = [header.boot_epoch, header.seq, header.seq, {header.seq}, header.ts_ms]
            return
        _epoch, high, low, seen, _newest = state
        seen.add(header.seq)
        state[4] = max(state[4], header.ts_ms)
        if header.seq < low:
            state[2] = low = header.seq
        if header.seq > high:
            state[1] = header.seq
            # sequences that fell out of the horizon with no copy delivered are lost for good
            horizon = header.seq - self.redundancy
            start = max(high - self.redundancy, low)
            lost = max(0, horizon - start) - sum(1 for seq in seen if start <= seq < horizon)
            if lost:
                self.lost[header.node_key] = self.lost.get(header.node_key, 0) + lost
            state[3] = {seq for seq in seen if seq >= horizon}

    def export(self, since_ms: int) -> list[tuple]:
        """The window of every stream heard from since `since_ms`: ((node key, part, job, rank),
        boot epoch, highest seq, lowest seq, seqs seen in the horizon, newest timestamp)."""
        return [
            (stream, epoch, high, low, sorted(seen), newest)
            for stream, (epoch, high, low, seen, newest) in self._state.items()
            if newest >= since_ms
        ]

    def restore(self, entries: Sequence[tuple]) -> None:
        """Take back windows `export` gave (after a restart), where this guard knows nothing newer."""
        for stream, epoch, high, low, seen, newest in entries:
            key = tuple(stream)
            known = self._state.get(key)
            if known is None or epoch > known[0]:
                self._state[key] = [epoch, high, low, set(seen), newest]
