"""One bad row never takes its neighbours with it: a timestamp or value that no table can
hold is a line error in `ingest` and a row set aside in `spool/rejected/` (with its reason) on replay
and write; the good rows of the same line set, file or batch are stored; a spool file whose header
is damaged is quarantined with its reason instead of waiting forever; spool files are private."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
import time

import pytest

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.spool import Spool
from stethoscope.store.writer import Writer

from conftest import TOP

NOW_MS = time.time_ns() // 1_000_000 - 3_600_000  # within the raw TTL


def cli(*args, env_extra=None):
    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", *args], capture_output=True, text=True, env=env, cwd=TOP
    )


def good_row(i: int, node: str = "n1") -> dict:
    return {
        "node_id": node,
        "metric_name": "gpu_power_watts",
        "device": "gpu0",
        "labels": {},
        "value": float(i),
        "timestamp": NOW_MS + i,
    }


def stored(dsn: str, node: str | None = None) -> int:
    where = f" WHERE node_id = '{node}'" if node else ""
    with Store(dsn) as store:
        return store.query(f"SELECT count() FROM stethoscope.metrics FINAL{where}")[0][0]


def rejected_records(spool_dir) -> list[dict]:
    folder = spool_dir / "rejected"
    if not folder.is_dir():
        return []
    return [
        json.loads(line) for path in sorted(folder.glob("*.ndjson")) for line in path.read_text().splitlines()
    ]


@pytest.mark.parametrize(
    "timestamp", ["Infinity", "-Infinity", "NaN", "1e400", "-1e300", "1e300", '"inf"', "1" + "0" * 400]
)
def test_ingest_an_impossible_timestamp_is_a_line_error_and_the_good_lines_are_stored(tmp_path, timestamp):
    """Regression: Infinity and 1e400 crashed ingest (OverflowError, exit 3, nothing stored); -1e300
    passed validation, the batch's insert failed, and ingest said "spooled" with exit 0."""
    dsn, spool = f"chdb://{tmp_path / 'db'}", tmp_path / "spool"
    seconds = time.time() - 60
    lines = [
        json.dumps({**good_row(1), "timestamp": seconds}),
        json.dumps({**good_row(2)})[:-1].rsplit('"timestamp":', 1)[0] + f'"timestamp": {timestamp}}}',
        json.dumps({**good_row(3), "timestamp": seconds + 1}),
    ]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    assert cli("--dsn", dsn, "db", "init").returncode == 0
    result = cli("--dsn", dsn, "--spool-dir", str(spool), "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 2, result.stderr
    assert "rows.ndjson:2: timestamp" in result.stderr and "Traceback" not in result.stderr
    assert "stored 2 rows" in result.stdout
    assert stored(dsn) == 2
    assert not spool.exists() or not list(spool.glob("*.ndjson"))


@pytest.mark.parametrize(
    ("value", "reason"), [('"abc"', "not a number"), ("Infinity", "not finite"), ("1e400", "not finite")]
)
def test_ingest_a_value_that_is_not_a_finite_number_is_a_line_error(tmp_path, value, reason):
    dsn = f"chdb://{tmp_path / 'db'}"
    bad = json.dumps({**good_row(2), "timestamp": time.time()}).replace('"value": 2.0', f'"value": {value}')
    lines = [json.dumps({**good_row(1), "timestamp": time.time() - 1}), bad]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    result = cli("--dsn", dsn, "--spool-dir", str(tmp_path / "s"), "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 2 and "rows.ndjson:2: value " in result.stderr, result.stderr
    assert reason in result.stderr and "stored 1 rows" in result.stdout


@pytest.mark.parametrize(
    "shape",
    [
        {"node_id": ["n1"]},
        {"metric_name": ["gpu_power_watts"]},
        {"labels": {"a": {"b": 1}}},
        {"labels": []},
        {"device": {"x": 1}},
        {"node_id": ""},
    ],
)
def test_ingest_a_field_of_the_wrong_shape_is_a_line_error_not_a_crash(tmp_path, shape):
    dsn = f"chdb://{tmp_path / 'db'}"
    seconds = time.time() - 1
    lines = [
        json.dumps({**good_row(1), "timestamp": seconds}),
        json.dumps({**good_row(2), "timestamp": seconds, **shape}),
    ]
    (tmp_path / "rows.ndjson").write_text("\n".join(lines) + "\n")
    result = cli("--dsn", dsn, "--spool-dir", str(tmp_path / "s"), "ingest", str(tmp_path / "rows.ndjson"))
    assert result.returncode == 2 and "rows.ndjson:2: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert "stored 1 rows" in result.stdout


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda row: row.pop("device"), "missing column 'device'"),
        (lambda row: row.update(value="abc"), "value"),
        (lambda row: row.update(value=math.inf), "value"),
        (lambda row: row.update(timestamp=-(10**303)), "timestamp"),
        (lambda row: row.update(labels={"k": 1}), "labels"),
    ],
)
def test_a_bad_row_in_a_spool_file_is_rejected_alone_and_its_100_neighbours_are_stored(
    tmp_path, tmp_dsn, damage, reason
):
    """Regression: one row missing a column or with "value": "abc" quarantined all 100 good rows."""
    spool = Spool(tmp_path / "spool", tmp_dsn)
    rows = [good_row(i) for i in range(101)]
    damage(rows[50])
    path = spool.append("metrics", rows)
    with Store(tmp_dsn) as store:
        store.init_schema()
        report = spool.replay(store)
    assert report.rows == 100 and report.quarantined == [] and spool.pending() == []
    assert stored(tmp_dsn) == 100
    (record,) = rejected_records(tmp_path / "spool")
    assert record["table"] == "metrics" and reason in record["reason"] and record["from"] == path.name
    assert record["row"]["value"] == rows[50]["value"] or "value" in reason


def test_a_spool_file_with_a_damaged_header_is_quarantined_with_its_reason(tmp_path, tmp_dsn):
    """Regression: a damaged header left a file pending forever (never the store's, never moved)."""
    spool = Spool(tmp_path / "spool", tmp_dsn)
    path = spool.append("metrics", [good_row(i) for i in range(3)])
    text = path.read_text().splitlines()
    path.write_text('{"__spool__": {"dsn": "chdb:///x", "datab\n' + "\n".join(text[1:]) + "\n")
    writer = Writer(tmp_dsn, tmp_path / "spool")
    report = writer.write(Batch(metrics=MetricColumns.from_rows([good_row(9, node="n2")])))
    assert report.error is None and report.stored == 1
    assert spool.pending() == []
    moved = tmp_path / "spool/quarantine" / path.name
    assert moved.exists() and "header" in (moved.parent / (path.name + ".reason")).read_text()
    assert [p for p, _ in spool.quarantined()] == [moved]


def test_the_writer_sets_aside_a_row_no_table_can_hold_and_stores_the_rest(tmp_path, tmp_dsn):
    """Every entry hands its rows to the writer: a non-finite value or an impossible time that got
    that far costs its own row only, never the batch."""
    rows = [good_row(i) for i in range(10)]
    rows[3]["value"], rows[6]["timestamp"] = math.inf, 10**20
    report = Writer(tmp_dsn, tmp_path / "spool").write(Batch(metrics=MetricColumns.from_rows(rows)))
    assert report.error is None and (report.stored, report.rejected, report.spooled) == (8, 2, 0)
    assert stored(tmp_dsn) == 8
    reasons = sorted(r["reason"] for r in rejected_records(tmp_path / "spool"))
    assert len(reasons) == 2 and "finite" in reasons[1] and "timestamp" in reasons[0]


def test_spool_status_lists_rejected_rows_by_reason(tmp_path):
    dsn, spool_dir = f"chdb://{tmp_path / 'db'}", tmp_path / "spool"
    rows = [good_row(i) for i in range(5)]
    rows[1]["value"], rows[2]["value"] = "abc", "def"
    Spool(spool_dir, dsn).append("metrics", rows)
    assert cli("--dsn", dsn, "--spool-dir", str(spool_dir), "db", "init").returncode == 0
    status = cli("--spool-dir", str(spool_dir), "spool", "status")
    assert status.returncode == 0 and status.stdout.startswith("0 rows waiting")
    assert "2 rows rejected" in status.stdout and "not a number: 2" in status.stdout, status.stdout
    assert stored(dsn) == 3


def test_spool_files_and_their_folders_are_private(tmp_path, tmp_dsn):
    spool = Spool(tmp_path / "spool", tmp_dsn)
    path = spool.append("metrics", [good_row(1)])
    spool.reject([{"table": "metrics", "reason": "NaN", "row": {}}])
    (rejected,) = (tmp_path / "spool/rejected").glob("*.ndjson")
    for folder in (tmp_path / "spool", tmp_path / "spool/rejected"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    for file in (path, rejected):
        assert stat.S_IMODE(file.stat().st_mode) == 0o600, file


def test_rows_the_store_itself_refuses_are_found_alone_and_the_rest_of_their_file_is_stored(
    tmp_path, tmp_dsn
):
    """Past the checks of each column's type, the store may refuse a row for its own reasons (here a
    CHECK constraint a DBA added): the replay finds those rows by halving and stores the others."""
    spool = Spool(tmp_path / "spool", tmp_dsn)
    rows = [good_row(i) for i in range(50)]
    rows[7]["value"] = rows[31]["value"] = 5e6
    spool.append("metrics", rows)
    with Store(tmp_dsn) as store:
        store.init_schema()
        store.command("ALTER TABLE stethoscope.metrics ADD CONSTRAINT sane CHECK value < 1000000")
        report = spool.replay(store)
    assert report.rows == 48 and report.quarantined == [] and spool.pending() == []
    assert stored(tmp_dsn) == 48
    refused = rejected_records(tmp_path / "spool")
    assert sorted(r["row"]["timestamp"] for r in refused) == [NOW_MS + 7, NOW_MS + 31]
    assert all("sane" in r["reason"] for r in refused)


def test_good_rows_the_store_refuses_for_its_memory_limit_are_never_set_aside_and_are_stored_later(
    tmp_path, tmp_dsn
):
    """Regression: any error while `SELECT 1` still answered was blamed on the rows: two good rows
    with long labels, refused alone for the store's memory limit, ended up in rejected/."""
    base = time.time_ns() // 1_000_000 - 3_600_000
    rows = [{**good_row(i), "timestamp": base + i} for i in range(8)]
    rows[2]["labels"] = rows[5]["labels"] = {"note": "x" * 10_000_000}  # long, and fit for the table
    spool = Spool(tmp_path / "spool", tmp_dsn)
    path = spool.append("metrics", rows)
    with Store(tmp_dsn) as store:
        store.init_schema()
        store.client.set_client_setting("max_memory_usage", 20_000_000)  # the store is short of memory
        report = spool.replay(store)
    assert rejected_records(tmp_path / "spool") == [] and spool.pending() == [path]
    assert report.rows == 0 and report.quarantined == []
    assert any("memory limit exceeded" in problem for problem in report.problems), report.problems
    with Store(tmp_dsn) as store:  # the store has room again: the file replays whole
        report = spool.replay(store)
    assert report.rows == 8 and spool.pending() == [] and stored(tmp_dsn) == 8
    assert rejected_records(tmp_path / "spool") == []


def test_a_file_the_store_refuses_for_too_many_parts_waits_without_counting_attempts(tmp_path, tmp_dsn):
    """Regression: the store's own refusal (TOO_MANY_PARTS) counted as the file's failed replay; after
    3 the good file was quarantined."""
    base = time.time_ns() // 1_000_000 - 3_600_000
    spool = Spool(tmp_path / "spool", tmp_dsn)
    path = spool.append("metrics", [{**good_row(i), "timestamp": base + i} for i in range(5)])
    with Store(tmp_dsn) as store:
        store.init_schema()
        store.command("SYSTEM STOP MERGES stethoscope.metrics")
        store.command("ALTER TABLE stethoscope.metrics MODIFY SETTING parts_to_throw_insert = 1")
        store.insert_metrics(MetricColumns.from_rows([good_row(99, node="n2")]))  # one part: the limit
        for _ in range(4):
            report = spool.replay(store)
            assert report.rows == 0 and report.quarantined == [], report.problems
        assert spool.pending() == [path] and spool.quarantined() == []
        assert "TOO_MANY_PARTS" in " ".join(report.problems) and "attempt" not in " ".join(report.problems)
        store.command("ALTER TABLE stethoscope.metrics MODIFY SETTING parts_to_throw_insert = 3000")
        report = spool.replay(store)
    assert report.rows == 5 and spool.pending() == [] and rejected_records(tmp_path / "spool") == []
