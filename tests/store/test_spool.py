"""Spool and replay: nothing acknowledged is lost, torn lines are tolerated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from stethoscope.store.batch import Batch, MetricColumns
from stethoscope.store.client import Store
from stethoscope.store.spool import Spool
from stethoscope.store.writer import Writer

from conftest import database_held_elsewhere

NOW = time.time_ns() // 1_000_000 - 3_600_000  # within the raw TTL


def rows(n, node="n1", start=NOW):
    return [
        {
            "node_id": node,
            "metric_name": "gpu_power_watts",
            "device": "gpu0",
            "labels": {},
            "value": float(i),
            "timestamp": start + i,
        }
        for i in range(n)
    ]


def stored(dsn, database="stethoscope"):
    with Store(dsn, database) as store:
        return store.query(f"SELECT count() FROM {database}.metrics FINAL")[0][0]


def test_append_then_replay_removes_the_file(tmp_path, tmp_dsn):
    spool = Spool(tmp_path / "spool", tmp_dsn)
    spool.append("metrics", rows(10))
    assert spool.pending_rows() == 10
    with Store(tmp_dsn) as store:
        store.init_schema()
        report = spool.replay(store)
    assert (report.rows, report.files) == (10, 1) and spool.pending() == []
    assert stored(tmp_dsn) == 10


def test_torn_last_line_and_garbage_lines(tmp_path, tmp_dsn):
    spool = Spool(tmp_path / "spool", tmp_dsn)
    path = spool.append("metrics", rows(3))
    with open(path, "a") as handle:
        handle.write("this is not json\n")
        handle.write(json.dumps(rows(1, node="n2")[0]) + "\n")
        handle.write('{"node_id": "n3", "metric_na')  # a crash mid-line
    with Store(tmp_dsn) as store:
        store.init_schema()
        report = spool.replay(store)
    assert report.rows == 4 and report.torn_lines == 1 and report.rejected_lines == 1
    (kept,) = (tmp_path / "spool/rejected").glob("*.ndjson")
    assert json.loads(kept.read_text()) == {
        "table": "metrics", "reason": "not JSON", "line": "this is not json", "from": path.name
    }  # fmt: skip
    assert stored(tmp_dsn) == 4


def test_rows_spooled_for_another_dsn_are_not_replayed_into_this_one(tmp_path, tmp_dsn):
    """Rows meant for a server that was down stay for it; `spool replay --into` moves them on purpose."""
    batch = Batch(metrics=MetricColumns.from_rows(rows(25)))
    down = Writer("http://admin:pw@127.0.0.1:9/prod", tmp_path / "spool", timeout=3).write(batch)
    assert down.error and down.spooled == 25 and down.stored == 0
    up = Writer(tmp_dsn, tmp_path / "spool").write(Batch(metrics=MetricColumns.from_rows(rows(5, node="n2"))))
    assert up.error is None and up.replayed == 0 and up.stored == 5
    assert stored(tmp_dsn) == 5 and Spool(tmp_path / "spool").pending_rows() == 25
    [waiting] = Spool(tmp_path / "spool").status()
    assert waiting.target == "http://admin@127.0.0.1:9 database prod" and waiting.rows == 25
    with Store(tmp_dsn) as store:
        moved = Spool(tmp_path / "spool").replay(store, into=True)
    assert moved.rows == 25 and stored(tmp_dsn) == 30


def test_rows_spooled_for_another_database_are_not_replayed_into_this_one(tmp_path, tmp_dsn):
    Spool(tmp_path / "spool", tmp_dsn, "other").append("metrics", rows(4))
    with Store(tmp_dsn) as store:
        store.init_schema()
        report = Spool(tmp_path / "spool").replay(store)
    assert (report.rows, report.other_targets) == (0, 1) and stored(tmp_dsn) == 0
    with Store(tmp_dsn, "other") as store:
        store.init_schema()
        assert Spool(tmp_path / "spool").replay(store).rows == 4
    assert stored(tmp_dsn, "other") == 4


def test_a_row_missing_a_column_is_set_aside_alone_and_later_writes_go_on(tmp_path, tmp_dsn):
    spool = Spool(tmp_path / "spool", tmp_dsn)
    broken = rows(3)
    del broken[1]["device"]
    spool.append("metrics", broken)
    spool.append("metrics", rows(2, node="n2"))
    writer = Writer(tmp_dsn, tmp_path / "spool")
    reports = [writer.write(Batch(metrics=MetricColumns.from_rows(rows(1, node=f"w{i}")))) for i in range(4)]
    assert all(report.error is None and report.stored == 1 for report in reports)
    assert reports[0].replayed == 4  # both files at once: the broken row's two neighbours too
    assert spool.pending() == [] and spool.quarantined() == []
    assert spool.rejected() == (1, {"missing column 'device'": 1})
    assert stored(tmp_dsn) == 4 + 4


def test_a_file_the_store_refuses_as_a_whole_is_quarantined_and_later_writes_go_on(tmp_path, tmp_dsn):
    """A file the store refuses whole (its table is gone) is not its rows' fault: it is retried, then
    quarantined with the reason, while the other files replay and writes go on."""
    spool = Spool(tmp_path / "spool", tmp_dsn)
    bad = spool.append("nodes", [{"node_id": "n1", "slurm_name": "n1", "rack": "", "switch": "",
                                  "groups": [], "updated_at": NOW}])  # fmt: skip
    spool.append("metrics", rows(2, node="n2"))
    with Store(tmp_dsn) as store:
        store.init_schema()
        store.command("DROP TABLE stethoscope.nodes")
    writer = Writer(tmp_dsn, tmp_path / "spool")
    reports = [writer.write(Batch(metrics=MetricColumns.from_rows(rows(1, node=f"w{i}")))) for i in range(4)]
    assert all(report.error is None and report.stored == 1 for report in reports)
    assert reports[0].replayed == 2  # the good file replays at once, beside the bad one
    assert spool.pending() == []
    quarantined = tmp_path / "spool/quarantine" / bad.name
    assert (
        quarantined.exists()
        and "failed 3 replays" in (quarantined.parent / (bad.name + ".reason")).read_text()
    )
    assert [path for path, _ in spool.quarantined()] == [quarantined]
    assert stored(tmp_dsn) == 2 + 4


def test_bench_rows_are_on_disk_before_the_write_and_gone_after(tmp_path, tmp_dsn):
    bench = {
        "run_id": "r1",
        "node_id": "n1",
        "suite": "storage",
        "metric_name": "bench_fio_randread_iops",
        "device": "nvme0n1",
        "labels": {},
        "value": 1e6,
        "unit": "iops",
        "repetition": 1,
        "class_fingerprint": "c",
        "node_fingerprint": "n",
        "unstable": 0,
        "timestamp": NOW,
    }
    down = Writer("http://127.0.0.1:9/x", tmp_path / "spool", timeout=3).write(Batch(bench=[bench]))
    assert down.spooled == 1 and [p.name.split("-")[0] for p in Spool(tmp_path / "spool").pending()] == [
        "bench_results"
    ]
    with Store(tmp_dsn) as store:
        store.init_schema()
        Spool(tmp_path / "spool").replay(store, into=True)
        assert store.query("SELECT value FROM stethoscope.bench_results") == [(1e6,)]
    assert Spool(tmp_path / "spool").pending() == []


def test_kill_9_mid_write_loses_nothing_acknowledged(tmp_path, tmp_dsn):
    """A writer appends batches and prints each acknowledgement; it is killed at a random moment."""
    spool_dir = tmp_path / "spool"
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        from stethoscope.store.spool import Spool
        spool = Spool({str(spool_dir)!r}, {tmp_dsn!r})
        for batch in range(100000):
            spool.append("metrics", [{{"node_id": "n%d" % batch, "metric_name": "gpu_power_watts",
                "device": "gpu0", "labels": {{}}, "value": float(i), "timestamp": {NOW} + i}}
                for i in range(500)])
            print(batch, flush=True)
    """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 30
    acknowledged = -1
    while acknowledged < 20 and time.time() < deadline:
        acknowledged = int(writer.stdout.readline())
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait()
    acknowledged = max([acknowledged] + [int(line) for line in writer.stdout.read().split()])
    assert acknowledged >= 20
    with Store(tmp_dsn) as store:
        store.init_schema()
        report = Spool(spool_dir).replay(store)
        nodes = store.query("SELECT uniqExact(node_id), count() FROM stethoscope.metrics FINAL")[0]
    # every acknowledged batch is there in full; a batch cut by the kill may add rows, never remove any
    assert nodes[0] >= acknowledged + 1 and nodes[1] >= (acknowledged + 1) * 500
    assert report.problems == [] or all("torn" in p for p in report.problems)


def dead_pid():
    command = [sys.executable, "-c", "import os; print(os.getpid())"]
    return int(subprocess.run(command, capture_output=True, text=True, check=True).stdout)


def test_a_part_file_killed_before_its_header_was_written_is_removed_not_quarantined(tmp_path, tmp_dsn):
    """kill -9 between a .part's creation and its header's write leaves an empty file (or a cut first
    line): it never held an acknowledged row, so it is dropped as torn, not set aside as damaged."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    pid = dead_pid()
    (spool_dir / f"metrics-{NOW}-{pid}-1.ndjson.part").write_bytes(b"")
    (spool_dir / f"metrics-{NOW}-{pid}-2.ndjson.part").write_bytes(b'{"__spool__": {"dsn"')
    # a blank first line with a row after it is damaged, not unwritten: quarantined, never deleted
    row = json.dumps(rows(1)[0]).encode()
    (spool_dir / f"metrics-{NOW}-{pid}-3.ndjson.part").write_bytes(b"\n" + row + b"\n")
    with Store(tmp_dsn) as store:
        store.init_schema()
        report = Spool(spool_dir).replay(store)
    quarantined = [path.name for path, _reason in Spool(spool_dir).quarantined()]
    assert quarantined == [f"metrics-{NOW}-{pid}-3.ndjson.part"]
    assert not list(spool_dir.glob("*.part"))
    assert sum("torn" in p for p in report.problems) == 2


def test_embedded_database_busy_spools_and_replays_later(tmp_path):
    path = tmp_path / "db"
    with database_held_elsewhere(path):
        busy = Writer(f"chdb://{path}", tmp_path / "spool").write(
            Batch(metrics=MetricColumns.from_rows(rows(7)))
        )
    assert busy.spooled == 7 and "embedded database in use by another process" in busy.error
    # A fresh process, as the next sweep is: this one keeps the failed open's lock until it exits.
    replay = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            from stethoscope.store.batch import Batch
            from stethoscope.store.writer import Writer
            print(Writer("chdb://{path}", {str(tmp_path / "spool")!r}).write(Batch()).replayed)
        """),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert replay.stdout.strip() == "7"
