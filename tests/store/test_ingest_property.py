"""For any input, the ingest path and the stream's decoder keep every good row exactly once, set every
bad one aside with its reason, and never crash. Real parts: NDJSON through `parse_ndjson`
and the Writer into an embedded ClickHouse; spool files replayed row by row; datagrams through
`wire.decode` and a real Collector into the same store."""

from __future__ import annotations

import itertools
import json
import math
import struct
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stethoscope.catalog import default_catalog
from stethoscope.store.batch import Batch
from stethoscope.store.client import Store
from stethoscope.store.ingest import parse_ndjson
from stethoscope.store.spool import Spool
from stethoscope.store.writer import Writer
from stethoscope.telemetry import wire
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector
from stethoscope.timeutil import MAX_MS, MIN_MS

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
NOW_S = int(time.time()) - 120
EXAMPLE = itertools.count()
SECRET = b"property-test-secret-0123456789"

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
names = st.text(alphabet="abcdefghij-_0123456789", min_size=1, max_size=8)
# node, device and label names as stethoscope.names accepts them: no leading '-' or '_' (an option, a
# hidden name), label values with no template braces, control or bidi characters
node_names = st.from_regex(r"[a-j0-9][a-j0-9_-]{0,7}", fullmatch=True)
label_keys = st.from_regex(r"[a-j_][a-j0-9_]{0,7}", fullmatch=True)
label_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Cf", "Zl", "Zp"), blacklist_characters="{}"),
    max_size=8,
)
# what a node that reports templates, options and terminal escapes as names sends
hostile_names = st.one_of(
    st.fixed_dictionaries(
        {
            "device": st.sampled_from(
                ["/dev/{{ lookup('pipe', 'id') }}", "-rf", "a/../b", "sd\x1b[2Ja", "gpu 0"]
            )
        }
    ),
    st.fixed_dictionaries({"node_id": st.sampled_from(["{{ 7 * 7 }}", "-n", "node 1", "node\u202e1"])}),
    st.fixed_dictionaries({"labels": st.sampled_from([{"k": "{% raw %}"}, {"bad key": "v"}, {"k": "a\nb"}])}),
    st.fixed_dictionaries({"metric_name": st.just("smart_{{ 7 * 7 }}")}),
)
good_values = st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53)
good_rows = st.fixed_dictionaries(
    {
        "node_id": node_names,
        "metric_name": st.sampled_from(
            ["gpu_power_watts", "gpu_temperature_celsius", "nvme_critical_warning"]
        ),
        "device": st.one_of(st.none(), node_names),
        "labels": st.dictionaries(label_keys, label_text, max_size=3),
        "value": good_values,
        "timestamp": st.integers(NOW_S - 20 * 86400, NOW_S),
    }
)
bad_fields = st.one_of(
    st.fixed_dictionaries({"value": st.sampled_from([math.inf, -math.inf, math.nan, 1e400])}),
    st.fixed_dictionaries(
        {"value": st.one_of(text, st.booleans(), st.none(), st.lists(st.integers(), max_size=2))}
    ),
    st.fixed_dictionaries(
        {
            "timestamp": st.one_of(
                st.sampled_from([math.inf, -math.inf, math.nan, 1e300, -1e300]), st.booleans()
            )
        }
    ),
    st.fixed_dictionaries({"timestamp": st.integers(10**11, 10**400) | st.integers(-(10**400), -(10**10))}),
    st.fixed_dictionaries({"node_id": st.one_of(st.just(""), st.integers(), st.lists(names, max_size=2))}),
    st.fixed_dictionaries(
        {"labels": st.one_of(st.lists(text, max_size=2), st.dictionaries(names, st.lists(text), min_size=1))}
    ),
    st.fixed_dictionaries({"metric_name": st.one_of(names, st.integers(), st.lists(names, max_size=1))}),
    hostile_names,
)
# what the metrics table itself cannot hold (an unknown metric it can: ingest's own rule)
unfit_fields = st.one_of(
    st.fixed_dictionaries({"value": st.sampled_from([math.inf, -math.inf, math.nan])}),
    st.fixed_dictionaries(
        {"value": st.one_of(text, st.booleans(), st.none(), st.lists(st.integers(), max_size=2))}
    ),
    st.fixed_dictionaries(
        {"timestamp": st.one_of(st.sampled_from([math.inf, math.nan, 1e300, -1e300]), st.booleans(), text)}
    ),
    st.fixed_dictionaries({"timestamp": st.integers(10**14, 10**400) | st.integers(-(10**400), -(10**13))}),
    st.fixed_dictionaries({"node_id": st.one_of(st.integers(), st.none(), st.lists(names, max_size=2))}),
    st.fixed_dictionaries(
        {"labels": st.one_of(st.lists(text, max_size=2), st.dictionaries(names, st.integers(), min_size=1))}
    ),
    st.fixed_dictionaries({"metric_name": st.one_of(st.integers(), st.lists(names, max_size=1))}),
    hostile_names,
)
garbage = st.text(
    alphabet=st.characters(blacklist_characters="\n\r", blacklist_categories=("Cs",)), max_size=30
)


@pytest.fixture(scope="module")
def dsn(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("property") / "db"
    with Store(f"chdb://{path}") as store:
        store.init_schema()
    return f"chdb://{path}"


def _stored(dsn: str, example: str) -> list[tuple]:
    with Store(dsn) as store:
        return store.query(
            "SELECT node_id, metric_name, device, value, toUnixTimestamp64Milli(timestamp) "
            "FROM stethoscope.metrics WHERE labels['example'] = {e:String} ORDER BY timestamp",
            {"e": example},
        )


def _expected(rows: list[dict]) -> list[tuple]:
    return sorted(
        (
            (r["node_id"], r["metric_name"], r["device"] or "", float(r["value"]), r["timestamp"])
            for r in rows
        ),
        key=lambda row: row[4],
    )


def _lines(data, example: str) -> tuple[list[str], list[dict], set[int]]:
    """NDJSON lines mixing good rows, rows with one bad field and garbage; the good rows (each with a
    time of its own, in ms) and the numbers of the bad lines."""
    picked = data.draw(
        st.lists(
            st.tuples(st.sampled_from(["good", "bad", "garbage"]), good_rows, bad_fields, garbage),
            max_size=30,
        )
    )
    lines, good, bad = [], [], set()
    for number, (kind, row, damage, junk) in enumerate(picked, start=1):
        row = {
            **row,
            "labels": {**row["labels"], "example": example},
            "timestamp": row["timestamp"] + number / 1000,
        }
        if kind == "garbage":
            if not junk.strip():
                continue  # an empty line is no line
            lines.append(junk)
            bad.add(len(lines))  # not JSON, or JSON that is no row
            continue
        if kind == "bad":
            row = {**row, **damage}
        lines.append(json.dumps(row))
        if kind == "good":
            good.append({**row, "timestamp": round(row["timestamp"] * 1000)})
        else:
            bad.add(len(lines))
    return lines, good, bad


@given(data=st.data())
@SETTINGS
def test_ndjson_through_validation_and_the_writer_stores_each_good_row_once(dsn, tmp_path_factory, data):
    example = str(next(EXAMPLE))
    lines, good, bad = _lines(data, example)
    folder = tmp_path_factory.mktemp("ndjson")
    source = folder / "rows.ndjson"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    parsed = parse_ndjson(source, default_catalog(), now=(NOW_S + 120) * 1000)
    said = {
        int(error.split(":")[1])
        for error in [*parsed.errors, *parsed.future]
        if error.startswith(str(source))
    }
    assert said == bad, (parsed.errors, parsed.future, lines)
    report = Writer(dsn, folder / "spool").write(Batch(metrics=parsed.metrics))
    assert report.error is None and report.rejected == 0 and report.stored == len(good)
    assert _stored(dsn, example) == _expected(good)


@given(data=st.data())
@SETTINGS
def test_a_spool_file_of_good_and_bad_rows_replays_the_good_ones_once(dsn, tmp_path_factory, data):
    example = str(next(EXAMPLE))
    picked = data.draw(
        st.lists(st.tuples(st.booleans(), good_rows, unfit_fields, st.booleans()), max_size=30)
    )
    rows, good = [], []
    for number, (ok, row, damage, cut) in enumerate(picked, start=1):
        row = {**row, "labels": {**row["labels"], "example": example}, "device": row["device"] or ""}
        row["timestamp"] = row["timestamp"] * 1000 + number
        if not ok:
            row = {**row, **damage}
            if cut:
                row.pop(data.draw(st.sampled_from(sorted(row))))
        rows.append(row)
        if ok:
            good.append(row)
    spool = Spool(tmp_path_factory.mktemp("spool"), dsn)
    spool.append("metrics", rows)
    with Store(dsn) as store:
        report = spool.replay(store)
    assert report.quarantined == [] and spool.pending() == [] and report.rows == len(good)
    assert _stored(dsn, example) == _expected(good)
    rejected = [
        json.loads(line)
        for path in spool.rejected_dir.glob("*.ndjson")
        for line in path.read_text().splitlines()
    ]
    assert len(rejected) == len(rows) - len(good) and all(r["reason"] for r in rejected)


@given(data=st.binary(max_size=wire.MAX_DATAGRAM + 8))
@settings(max_examples=300, deadline=None)
def test_the_wire_decoder_never_raises_on_any_bytes(data):
    result = wire.decode(data, lambda _key: [b"k" * 32], int(time.time() * 1000))
    assert isinstance(result, wire.Sample | wire.Rejection)


float32s = st.floats(width=32) | st.sampled_from([math.inf, -math.inf, math.nan])


@given(values=st.lists(st.lists(float32s, min_size=1, max_size=wire.MAX_VALUES), min_size=1, max_size=6))
@SETTINGS
def test_signed_datagrams_of_any_values_store_each_finite_value_once_and_count_the_rest(dsn, values):
    metric_set = load_sets()["gpu_node"]
    node = f"prop-{uuid.uuid4().hex[:8]}"
    keyring = Keyring({9: node}, [SECRET])
    collector = Collector(keyring, {metric_set.id: metric_set}, Writer(dsn, "/nonexistent/spool").write)
    now = int(time.time() * 1000)
    slots = len(metric_set.parts["node"])
    finite = infinite = 0
    for seq, sample in enumerate(values):
        data = wire.encode(
            wire.node_secret(SECRET, node), set_id=metric_set.id, node_key=9, part=0, boot_epoch=1,
            seq=seq, ts_ms=now - 1000 * (len(values) - seq), values=sample,
        )  # fmt: skip
        decoded = [struct.unpack("!f", struct.pack("!f", v))[0] for v in sample[:slots]]
        finite += sum(1 for v in decoded if math.isfinite(v))
        infinite += sum(1 for v in decoded if math.isinf(v))
        assert collector.handle(data, now) is None
    report = collector.stop()
    assert report is not None and report.error is None
    with Store(dsn) as store:
        kept = store.query(
            "SELECT count(), countIf(NOT isFinite(value)) FROM stethoscope.metrics "
            "WHERE node_id = {n:String} AND labels['source'] = 'stream'",
            {"n": node},
        )[0]
    assert kept == (finite, 0)
    assert collector.stats.values_rejected.get("nonfinite", 0) == infinite
    assert MIN_MS < now < MAX_MS
