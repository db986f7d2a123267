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
import itertools
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
# A stream refused as replayed this long while its datagrams are signed and fresh is re-synchronised
# to them: six 5-second periods, so that a stream another sender still feeds (each sample kept
# restarts the count) never flaps, and a node whose clock moved back is back within a minute.
RESYNC_AFTER_MS = 30_000
MAX_JOB_STREAMS = 4096  # (job, rank) streams one node key may hold in the guard; the oldest go first

_HEADER = struct.Struct("!2sBBHHIIQIHBB")
HEADER_BYTES = _HEADER.size  # 32
assert HEADER_BYTES + 4 * MAX_VALUES + MAC_BYTES <= MAX_DATAGRAM

# Rejection reasons: the collector counts datagrams per reason, and per node only once the MAC verified.
SHORT, LENGTH, MAGIC_REASON, VERSION_REASON = "short", "length", "magic", "version"
SET, KEY, MAC, STALE, REPLAYED = "set", "key", "mac", "stale", "replayed"
REASONS = (SHORT, LENGTH, MAGIC_REASON, VERSION_REASON, SET, KEY, MAC, STALE, REPLAYED)
# Given only once the MAC verified: the node is known, not claimed, and may be named.
AUTHENTICATED_REASONS = (STALE, REPLAYED)


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
        return stream_of(self.header)


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


def stream_of(header: Header) -> tuple[int, int, int, int]:
    """What one sequence of samples belongs to: (node key, part, job, rank)."""
    return (header.node_key, header.part, header.job, header.rank)


class SequenceGuard:
    """Per stream: keep each (boot epoch, seq) once, refuse old ones, count samples no copy delivered.

    A sample is lost once a sequence REDUNDANCY + 1 ahead of it has arrived and it has not: no copy
    of it will be sent again. An older boot epoch, a sequence behind that horizon, or a newer boot
    epoch whose sample is older than the newest kept, is a replay.

    A stream refused as replayed for `resync_after_ms` while its datagrams are signed, fresh and newer
    than anything it kept is re-synchronised to them (`refused`, then `resync`): its sender's epoch or
    sequence moved back (a clock fix, a lost state file), and only the key's holder can sign fresh
    datagrams. A node key holds at most `max_job_streams` job-part streams, the least recently kept
    dropped for a new one (`evicted`); `prune` drops those silent past the freshness window.
    """

    def __init__(
        self,
        redundancy: int = REDUNDANCY,
        max_job_streams: int = MAX_JOB_STREAMS,
        resync_after_ms: int = RESYNC_AFTER_MS,
    ):
        self.redundancy = redundancy
        self.max_job_streams = max(1, max_job_streams)
        self.resync_after_ms = resync_after_ms
        # stream -> [boot epoch, highest seq, lowest seq seen in this epoch, seqs seen in the horizon,
        # newest timestamp in ms]
        self._state: dict[tuple[int, int, int, int], list] = {}
        # node key -> its job-part streams, least recently kept first (an ordered set: values unused)
        self._jobs: dict[int, dict[tuple[int, int, int, int], None]] = {}
        # stream -> when (the collector's ms) its signed, fresh datagrams began to be refused as replayed
        self._refused_since: dict[tuple[int, int, int, int], int] = {}
        self.lost: dict[int, int] = {}  # node key -> samples lost
        self.evicted: dict[int, int] = {}  # node key -> job streams dropped for the cap
        self.resyncs: dict[int, int] = {}  # node key -> streams re-synchronised

    def check(self, header: Header) -> str | None:
        """None for a new sample, "duplicate" for a copy already kept, REPLAYED for an old one."""
        state = self._state.get(stream_of(header))
        if state is None:
            return None
        epoch, high, _low, seen, newest = state
        if header.boot_epoch != epoch:
            restarted = header.boot_epoch > epoch and header.ts_ms >= newest
            return None if restarted else REPLAYED
        if header.seq in seen:
            return "duplicate"
        if header.seq + self.redundancy < high:
            return REPLAYED
        return None

    def accept(self, header: Header) -> None:
        """Record a sample check() called new (after its MAC was verified)."""
        stream = stream_of(header)
        self._refused_since.pop(stream, None)
        state = self._state.get(stream)
        if state is None or header.boot_epoch > state[0]:
            self._begin(stream, header)
            return
        if header.part == JOB_PART:
            self._admit_job(stream)
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

    def refused(self, header: Header, now_ms: int) -> bool:
        """Note that a datagram check() called REPLAYED was signed and fresh; whether its stream has
        been refused so for resync_after_ms with nothing kept, and this sample is newer than any it kept
        (an exact replay of a kept datagram never is)."""
        stream = stream_of(header)
        state = self._state.get(stream)
        if state is None:
            return False
        since = self._refused_since.get(stream)
        if since is None or since > now_ms:  # the first refusal, or the collector's clock moved back
            self._refused_since[stream] = since = now_ms
        return now_ms - since >= self.resync_after_ms and header.ts_ms > state[4]

    def resync(self, header: Header) -> None:
        """Start the stream afresh at the sample `refused` answered True for, and count it."""
        self._refused_since.pop(stream_of(header), None)
        self._begin(stream_of(header), header)
        self.resyncs[header.node_key] = self.resyncs.get(header.node_key, 0) + 1

    def prune(self, before_ms: int) -> int:
        """Drop the job streams whose newest sample is older than `before_ms` (a replay of them is
        stale anyway); how many. Node and GPU streams stay: a node key has at most 255, and a node
        back from a long silence is owed its loss count."""
        pruned = 0
        for node_key in list(self._jobs):
            jobs = self._jobs[node_key]
            # least recently kept first: stop at the first still heard from
            silent = list(itertools.takewhile(lambda stream: self._state[stream][4] < before_ms, jobs))
            for stream in silent:
                self._forget(stream)
            pruned += len(silent)
            if not jobs:
                del self._jobs[node_key]
        return pruned

    def _begin(self, stream: tuple[int, int, int, int], header: Header) -> None:
        """The stream's window starts at this sample: a new stream, a restart or a re-sync."""
        if header.part == JOB_PART:
            self._admit_job(stream)
        self._state[stream] = [header.boot_epoch, header.seq, header.seq, {header.seq}, header.ts_ms]

    def _admit_job(self, stream: tuple[int, int, int, int]) -> None:
        """Make `stream` its node's most recently kept job stream; over the cap, drop the least recent."""
        node_key = stream[0]
        jobs = self._jobs.setdefault(node_key, {})
        if stream in jobs:
            del jobs[stream]
        while len(jobs) >= self.max_job_streams:
            self._forget(next(iter(jobs)))
            self.evicted[node_key] = self.evicted.get(node_key, 0) + 1
        jobs[stream] = None

    def _forget(self, stream: tuple[int, int, int, int]) -> None:
        self._state.pop(stream, None)
        self._refused_since.pop(stream, None)
        self._jobs.get(stream[0], {}).pop(stream, None)

    def export(self, since_ms: int) -> list[tuple]:
        """The window of every stream heard from since `since_ms`: ((node key, part, job, rank),
        boot epoch, highest seq, lowest seq, seqs seen in the horizon, newest timestamp)."""
        return [
            (stream, epoch, high, low, sorted(seen), newest)
            for stream, (epoch, high, low, seen, newest) in self._state.items()
            if newest >= since_ms
        ]

    def restore(self, entries: Sequence[tuple]) -> None:
        """Take back windows `export` gave (after a restart), where this guard knows nothing newer;
        oldest first, so that the job stream cap keeps each node's most recent."""
        for stream, epoch, high, low, seen, newest in sorted(entries, key=lambda entry: entry[5]):
            key = tuple(stream)
            known = self._state.get(key)
            if known is None or epoch > known[0]:
                if key[1] == JOB_PART:
                    self._admit_job(key)
                self._state[key] = [epoch, high, low, set(seen), newest]
