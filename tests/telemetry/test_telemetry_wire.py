"""The stream's datagram: round trip, and every damaged or forged datagram rejected with a reason."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stethoscope.telemetry import wire

SECRET = b"cluster-secret-for-tests"
KEYS = {7: [wire.node_secret(SECRET, "node07")], 8: [wire.node_secret(SECRET, "node08")]}
NOW = 1_800_000_000_000


def keys_of(node_key: int):
    return KEYS.get(node_key)


float32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
headers = st.fixed_dictionaries(
    {
        "set_id": st.integers(0, 2**16 - 1),
        "node_key": st.sampled_from([7, 8]),
        "part": st.integers(0, 255),
        "boot_epoch": st.integers(0, 2**32 - 1),
        "seq": st.integers(0, 2**32 - 1),
        "ts_ms": st.integers(NOW - wire.FRESHNESS_MS, NOW + wire.FRESHNESS_MS),
        "job": st.integers(0, 2**32 - 1),
        "rank": st.integers(0, 2**16 - 1),
    }
)
value_lists = st.lists(st.one_of(float32, st.none()), max_size=wire.MAX_VALUES)


def _encode(fields: dict, values) -> bytes:
    node = "node07" if fields["node_key"] == 7 else "node08"
    return wire.encode(wire.node_secret(SECRET, node), values=values, **fields)


def _same(a: float, b) -> bool:
    """NaN and None travel as missing; ±Inf is refused by the decoder and arrives as missing too."""
    return (math.isnan(a) and (b is None or not math.isfinite(b))) or a == b


@settings(max_examples=300)
@given(headers, value_lists)
def test_round_trip_keeps_header_and_values(fields, values) -> None:
    data = _encode(fields, values)
    assert len(data) <= wire.MAX_DATAGRAM
    sample = wire.decode(data, keys_of, NOW)
    assert isinstance(sample, wire.Sample), sample
    assert {k: getattr(sample.header, k) for k in fields} == fields
    assert len(sample.values) == len(values)
    assert all(_same(a, b) for a, b in zip(sample.values, values, strict=True))


def test_a_full_datagram_fits_128_bytes() -> None:
    fields = {"set_id": 1, "node_key": 7, "part": 0, "boot_epoch": 1, "seq": 1, "ts_ms": NOW}
    assert len(_encode(fields, [1.0] * wire.MAX_VALUES)) == 128
    with pytest.raises(ValueError, match="at most 20"):
        _encode(fields, [1.0] * 21)


@given(headers, value_lists, st.data())
def test_truncated_datagram_rejected_with_a_reason(fields, values, data) -> None:
    datagram = _encode(fields, values)
    cut = data.draw(st.integers(0, len(datagram) - 1))
    result = wire.decode(datagram[:cut], keys_of, NOW)
    assert isinstance(result, wire.Rejection)
    assert result.reason in wire.REASONS


@given(headers, value_lists, st.binary(min_size=1, max_size=64))
def test_extended_datagram_rejected_with_a_reason(fields, values, tail) -> None:
    result = wire.decode(_encode(fields, values) + tail, keys_of, NOW)
    assert isinstance(result, wire.Rejection)
    assert result.reason in (wire.LENGTH, wire.MAC)


@settings(max_examples=500)
@given(headers, value_lists, st.data())
def test_any_flipped_bit_rejected_with_a_reason(fields, values, data) -> None:
    datagram = bytearray(_encode(fields, values))
    bit = data.draw(st.integers(0, 8 * len(datagram) - 1))
    datagram[bit // 8] ^= 1 << (bit % 8)
    result = wire.decode(bytes(datagram), keys_of, NOW)
    assert isinstance(result, wire.Rejection), (bit, result)
    assert result.reason in wire.REASONS


@given(headers, value_lists)
def test_datagram_signed_with_another_nodes_key_rejected_as_bad_mac(fields, values) -> None:
    other = "node08" if fields["node_key"] == 7 else "node07"
    forged = wire.encode(wire.node_secret(SECRET, other), values=values, **fields)
    assert wire.decode(forged, keys_of, NOW) == wire.Rejection(wire.MAC)


@given(headers, value_lists)
def test_datagram_signed_with_a_guessed_cluster_secret_rejected(fields, values) -> None:
    forged = wire.encode(wire.node_secret(b"guess", "node07"), values=values, **fields)
    assert wire.decode(forged, keys_of, NOW) == wire.Rejection(wire.MAC)


@given(headers, value_lists, st.integers(0, 2**16 - 1).filter(lambda k: k not in KEYS))
def test_unknown_node_key_rejected(fields, values, node_key) -> None:
    datagram = wire.encode(b"any", values=values, **{**fields, "node_key": node_key})
    assert wire.decode(datagram, keys_of, NOW).reason == wire.KEY


@given(headers, value_lists, st.integers(0, 255).filter(lambda v: v != wire.VERSION))
def test_unknown_version_rejected(fields, values, version) -> None:
    datagram = bytearray(_encode(fields, values))
    datagram[2] = version
    assert wire.decode(bytes(datagram), keys_of, NOW).reason == wire.VERSION_REASON


def test_unknown_metric_set_rejected() -> None:
    fields = {"set_id": 9, "node_key": 7, "part": 0, "boot_epoch": 1, "seq": 1, "ts_ms": NOW}
    result = wire.decode(_encode(fields, [1.0]), keys_of, NOW, known_sets=lambda s: s == 1)
    assert result.reason == wire.SET


@given(headers, value_lists, st.integers(wire.FRESHNESS_MS + 1, 10**9), st.sampled_from([-1, 1]))
def test_stale_or_future_datagram_rejected(fields, values, skew, sign) -> None:
    datagram = _encode({**fields, "ts_ms": NOW + sign * skew}, values)
    assert wire.decode(datagram, keys_of, NOW).reason == wire.STALE


@given(st.binary(max_size=200))
def test_decoder_never_raises_on_arbitrary_bytes(data) -> None:
    result = wire.decode(data, keys_of, NOW)
    assert isinstance(result, wire.Rejection)


def _header(seq: int, epoch: int = 100, node_key: int = 7, part: int = 0) -> wire.Header:
    return wire.Header(wire.VERSION, part, 1, node_key, epoch, seq, NOW, 0, 0, 0, 0)


def _feed(guard: wire.SequenceGuard, header: wire.Header) -> str | None:
    verdict = guard.check(header)
    if verdict is None:
        guard.accept(header)
    return verdict


@given(st.integers(0, 1000), st.integers(wire.REDUNDANCY + 1, 500))
def test_replayed_old_sequence_rejected(first, ahead) -> None:
    guard = wire.SequenceGuard()
    assert _feed(guard, _header(first)) is None
    assert _feed(guard, _header(first + ahead)) is None
    assert _feed(guard, _header(first)) == wire.REPLAYED


def test_replayed_datagram_of_an_earlier_boot_rejected() -> None:
    guard = wire.SequenceGuard()
    assert _feed(guard, _header(5, epoch=200)) is None
    assert _feed(guard, _header(6, epoch=100)) == wire.REPLAYED
    assert _feed(guard, _header(0, epoch=300)) is None  # the agent restarted: a new epoch


@given(st.lists(st.integers(0, 60), min_size=1, max_size=200))
def test_each_sample_kept_once_and_loss_counts_what_no_copy_delivered(arrivals) -> None:
    """Arrivals are the agent's sends (sample s, then s-1..s-3 again) with some dropped."""
    guard = wire.SequenceGuard()
    kept = []
    for seq in arrivals:
        if _feed(guard, _header(seq)) is None:
            kept.append(seq)
    assert len(kept) == len(set(kept))
    high, low = max(kept), min(kept)
    final = set(range(low, high - wire.REDUNDANCY))
    assert guard.lost.get(7, 0) == len(final - set(kept))


def test_loss_counted_only_after_the_last_resend_could_have_come() -> None:
    guard = wire.SequenceGuard()
    for seq in (0, 2, 3, 4):  # 1 dropped in every copy so far
        _feed(guard, _header(seq))
    assert guard.lost == {}
    _feed(guard, _header(5))  # period 5 re-sends 2..4: 1 will never come again
    assert guard.lost == {7: 1}


def test_job_ids_travel_as_numbers_or_crc32() -> None:
    assert wire.job_field("4242") == (4242, wire.JOB_NUMERIC)
    job, flags = wire.job_field("llama-70b-run3")
    assert wire.job_label(job, flags).startswith("crc32:")
    assert wire.job_label(*wire.job_field("4242")) == "4242"


def test_values_float32_cannot_hold_become_missing() -> None:
    fields = {"set_id": 1, "node_key": 7, "part": 0, "boot_epoch": 1, "seq": 1, "ts_ms": NOW}
    sample = wire.decode(_encode(fields, [1e300, 2.5]), keys_of, NOW)
    assert math.isnan(sample.values[0]) and sample.values[1] == 2.5
    assert struct.calcsize("!2sBBHHIIQIHBB") == wire.HEADER_BYTES == 32


def test_float32_extremes_travel_and_only_overflow_becomes_missing() -> None:
    # float32's largest value once became NaN: the bound was 3.4e38, not FLT_MAX.
    flt_max = struct.unpack("!f", b"\x7f\x7f\xff\xff")[0]
    fields = {"set_id": 1, "node_key": 7, "part": 0, "boot_epoch": 1, "seq": 1, "ts_ms": NOW}
    sample = wire.decode(_encode(fields, [flt_max, -flt_max, 1e39, 3.4000001549684603e38]), keys_of, NOW)
    assert list(sample.values[:2]) == [flt_max, -flt_max]
    assert math.isnan(sample.values[2])
    assert sample.values[3] == 3.4000001549684603e38
