"""Job-level diagnosis beside the rules: a job whose ranks stop reporting while their GPUs hold their
memory at low utilisation (the seed's training stuck at 98 %), and the warm-up through which the
job-level rules hold off (loss variance is high while a model starts to learn).

The rows come the way the stream brings them: each rank's real job reporter
(stethoscope/telemetry/job.py) and each node's node part (encoded as the push agent encodes it) go
as datagrams through the real collector into the store; the sweep's XID rows are stored as the
gpu_facts module's callback stores them (device gpuN, label xid)."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.findings import diagnose
from stethoscope.diagnosis.job_watch import JobWatch
from stethoscope.diagnosis.rules import load_rules
from stethoscope.remediation.cycle import Cycles
from stethoscope.remediation.ledger import Ledger
from stethoscope.store.batch import MetricColumns
from stethoscope.store.writer import Writer
from stethoscope.telemetry import wire
from stethoscope.telemetry.job import Reporter
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.metric_set import load_sets
from stethoscope.telemetry.udp_collector import Collector
from stethoscope.timeutil import now_ms

from conftest import TOP

CATALOG = Catalog.load()
RULES = load_rules(TOP / "rules", CATALOG).rules
SECRET = b"job-watch-cluster-secret"
NODES = [f"j-{k:02d}" for k in range(8)]  # one rank each: an 8-rank job on 8 nodes
JOB = "7701"
PERIOD_MS = 5_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
STREAM_WINDOW_MS = 3 * MINUTE_MS  # the stream rules' window (rules/stream/gpu.yml)
# 10 minutes into the last hour: a job's earlier reports come from the hourly rollup, its last raw
AT = now_ms() // HOUR_MS * HOUR_MS - HOUR_MS + 10 * MINUTE_MS
GPU_MEMORY_MIB = 8 * 141_000  # an H200 node's 8 GPUs, summed by the node part (agg: sum)


class Stream:
    """What the nodes send, through the real collector into the test's store: node parts as the push
    agent encodes them, job parts from the real reporter."""

    def __init__(self, tmp_path: Path, store) -> None:
        self.keyring = Keyring({k + 1: node for k, node in enumerate(NODES)}, [SECRET])
        self.set = load_sets()["gpu_node"]
        self.now_ms = AT
        self.collector = Collector(
            self.keyring,
            {self.set.id: self.set},
            Writer(store.dsn, tmp_path / "spool", database=store.database).write,
            clock=lambda: self.now_ms / 1000,
        )
        self.seq = dict.fromkeys(NODES, 0)
        self.boot_epoch = AT // 1000 - 3600
        self.reporters: dict[tuple[str, str], Reporter] = {}
        self.job = JOB

    def node(self, node: str, ts_ms: int, utilization: float, memory_mib: float) -> None:
        node_key, key = self.keyring.key_for(node)
        slots = {"gpu_utilization_percent": utilization, "gpu_memory_used_mib": memory_mib}
        values = [slots.get(name, math.nan) for name in self.set.names(wire.NODE_PART)]
        datagram = wire.encode(
            key,
            set_id=self.set.id,
            node_key=node_key,
            part=wire.NODE_PART,
            boot_epoch=self.boot_epoch,
            seq=self.seq[node],
            ts_ms=ts_ms,
            values=values,
        )
        self.seq[node] += 1
        assert self.collector.handle(datagram, now_ms=ts_ms) is None

    def step(self, node: str, rank: int, ts_ms: int, step_s: float, loss: float) -> None:
        reporter = self.reporters.get((node, self.job))
        if reporter is None:
            node_key, key = self.keyring.key_for(node)
            reporter = Reporter(
                self.job, rank, "127.0.0.1:9", node_key, key, period=0, sock=_Handed(self), clock=self.clock
            )
            self.reporters[node, self.job] = reporter
        self.now_ms = ts_ms
        reporter.step(samples=64, loss=loss, step_time=step_s)

    def clock(self) -> float:
        return self.now_ms / 1000

    def stored(self) -> None:
        self.collector.flush(health=True)
        self.collector.sock.close()


class _Handed:
    """The reporter's socket: each datagram goes straight to the collector, as over loopback."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def sendto(self, data: bytes, address) -> int:
        verdict = self.stream.collector.handle(data, now_ms=self.stream.now_ms)
        assert verdict in (None, "duplicate"), verdict  # the reporter re-sends its last 3
        return len(data)


def periods(start_ms: int, end_ms: int) -> range:
    return range(start_ms, end_ms + 1, PERIOD_MS)


def run_job(
    stream: Stream,
    start_ms: int,
    stop_ms: int,
    end_ms: int,
    after_stop: str,
    wobble_from: int | None = None,
    every: int = 1,
    utilization: float = 96,
):
    """A synchronous job on NODES from `start_ms`: every rank reports each `every` periods until
    `stop_ms`; then its GPUs `hold` their memory idle (hung) or `release` it (the job ended). From
    `wobble_from` on (a job starting from scratch: its start), the loss falls fast and the step time
    varies."""
    rng = random.Random(5)
    for index, ts in enumerate(periods(start_ms, end_ms)):
        running = ts <= stop_ms
        for node in NODES:
            if running:
                stream.node(node, ts, utilization + rng.random() * 3, GPU_MEMORY_MIB * 0.9)
            elif after_stop == "hold":
                stream.node(node, ts, 3 + rng.random() * 3, GPU_MEMORY_MIB * 0.9)
            else:
                stream.node(node, ts, 0, 2_000)
        if not running or index % every:
            continue
        wobbling = wobble_from is not None and ts >= wobble_from
        for rank, node in enumerate(NODES):
            if wobbling:  # learning from scratch: the loss falls fast, compiles make steps uneven
                since = (ts - wobble_from) / PERIOD_MS
                loss = 2 + 8 * math.exp(-since / 40) + rng.gauss(0, 0.3)
                step = 0.30 if int(since) % 2 else 0.48
            else:
                loss, step = 2 + rng.gauss(0, 0.01), 0.40 * (1 + rng.gauss(0, 0.01))
            stream.step(node, rank, ts, step, loss)


def xid(store, node: str, gpu: str, code: str, first_ms: int, at_ms: int, event_ms: int) -> None:
    """The sweep's XID counter of one GPU, every 60 s: 0 at its first read, 1 from the event on."""
    batch = MetricColumns()
    for ts in range(first_ms, at_ms + 1, MINUTE_MS):
        batch.append(node, "gpu_xid_errors_total", gpu, {"xid": code}, float(ts >= event_ms), ts)
    store.insert_metrics(batch)


def hung(findings: list[dict]) -> list[dict]:
    return [f for f in findings if f["rule_id"] == "job.hung"]


def test_a_job_whose_ranks_stop_while_its_gpus_hold_memory_idle_is_one_finding_within_2_windows(
    tmp_path, store
):
    stop = AT - 2 * STREAM_WINDOW_MS
    stream = Stream(tmp_path, store)
    run_job(stream, AT - 30 * MINUTE_MS, stop, AT, after_stop="hold")
    stream.stored()
    assert hung(diagnose(store, RULES, stop + MINUTE_MS, CATALOG)) == []  # a minute's pause: no hang yet
    findings = diagnose(store, RULES, AT, CATALOG)
    (finding,) = hung(findings)
    assert finding["node_id"] == f"job:{JOB}" and finding["severity"] == "critical"
    assert finding["nodes"] == NODES
    assert f"job {JOB}" in finding["message"] and "8 ranks" in finding["message"]
    assert [f for f in findings if f["rule_id"].startswith("training_")] == []


def test_a_hung_jobs_node_with_an_xid_is_named_as_the_cause(tmp_path, store):
    stop = AT - 2 * STREAM_WINDOW_MS
    stream = Stream(tmp_path, store)
    run_job(stream, AT - 30 * MINUTE_MS, stop, AT, after_stop="hold")
    stream.stored()
    xid(store, "j-05", "gpu3", "79", AT - 30 * MINUTE_MS, AT, stop - 10_000)
    (finding,) = hung(diagnose(store, RULES, AT, CATALOG))
    assert "j-05" in finding["message"] and "gpu_xid_79" in finding["message"]
    assert json.loads(finding["evidence"])["causes"] == {"j-05": ["gpu_xid_79 gpu3"]}


def test_a_job_that_ends_and_frees_its_gpus_is_no_hang(tmp_path, store):
    stop = AT - 2 * STREAM_WINDOW_MS
    stream = Stream(tmp_path, store)
    run_job(stream, AT - 30 * MINUTE_MS, stop, AT, after_stop="release")
    stream.stored()
    assert hung(diagnose(store, RULES, AT, CATALOG)) == []


def test_a_job_merely_slow_to_report_is_no_hang(tmp_path, store):
    """Steps of 150 s, input-bound at 10 % utilisation: its last report 2m25s old is its own pace."""
    stream = Stream(tmp_path, store)
    start = AT - 145_000 - 16 * 150_000  # its last report 2m25s before AT
    run_job(stream, start, AT, AT, after_stop="hold", every=30, utilization=10)
    stream.stored()
    assert hung(diagnose(store, RULES, AT, CATALOG)) == []


def test_a_serve_cycle_records_the_hang_and_resolves_it_when_the_job_frees_its_gpus(tmp_path, store):
    stop = AT - 12 * MINUTE_MS  # in the hour before AT's
    stream = Stream(tmp_path, store)
    run_job(stream, AT - 30 * MINUTE_MS, stop, AT - 2 * MINUTE_MS, after_stop="hold")
    run_job(stream, AT - 2 * MINUTE_MS + PERIOD_MS, stop, AT, after_stop="release")  # killed at last
    stream.stored()
    cycles = Cycles(store.dsn, store.database, CATALOG, long_running=True)
    (finding,) = hung(cycles.run(RULES, AT - 3 * MINUTE_MS, store).findings)
    known = Ledger(store).known_findings()
    assert known[finding["finding_id"]].status == "open"
    assert known[finding["finding_id"]].nodes == (f"job:{JOB}", *NODES)
    assert hung(cycles.run(RULES, AT, store).findings) == []
    assert Ledger(store).known_findings()[finding["finding_id"]].status == "resolved"


def test_the_warm_up_is_a_setting_and_0_turns_it_off(tmp_path, store):
    assert JobWatch.of({}).warmup_seconds == 600
    assert JobWatch.of({"stethoscope_job_warmup": "15m"}).warmup_seconds == 900
    start = AT - 8 * MINUTE_MS
    stream = Stream(tmp_path, store)
    run_job(stream, start, AT, AT, after_stop="hold", wobble_from=start)
    stream.stored()
    no_warm_up = JobWatch.of({"stethoscope_job_warmup": 0})
    assert subhealth(diagnose(store, RULES, AT, CATALOG, jobs=no_warm_up)) == NODES


def subhealth(findings: list[dict]) -> list[str]:
    return sorted(f["node_id"] for f in findings if f["rule_id"] == "training_subhealth")


def test_a_healthy_job_starting_from_scratch_raises_no_warning_through_its_warm_up(tmp_path, store):
    start = AT - 8 * MINUTE_MS
    stream = Stream(tmp_path, store)
    run_job(stream, start, AT, AT, after_stop="hold", wobble_from=start)
    stream.stored()
    findings = diagnose(store, RULES, AT, CATALOG)
    assert subhealth(findings) == [] and hung(findings) == []


def test_a_job_starting_where_another_just_ended_is_held_off_through_its_warm_up(tmp_path, store):
    """Back to back on the same nodes: the job that ended is still in the rule's window, but the warm-up
    is the running job's, and a model learning from scratch is no straggler; the ended job is not hung."""
    stream = Stream(tmp_path, store)
    handover = AT - 4 * MINUTE_MS
    run_job(stream, AT - 40 * MINUTE_MS, handover, handover, after_stop="release")
    stream.job = "4242"
    start = handover + PERIOD_MS
    run_job(stream, start, AT, AT, after_stop="hold", wobble_from=start)
    stream.stored()
    findings = diagnose(store, RULES, AT, CATALOG)
    assert subhealth(findings) == [] and hung(findings) == []


def test_a_job_that_ended_hours_ago_is_not_hung_when_the_next_job_on_its_nodes_is(tmp_path, store):
    stream = Stream(tmp_path, store)
    run_job(stream, AT - 150 * MINUTE_MS, AT - 120 * MINUTE_MS, AT - 119 * MINUTE_MS, after_stop="release")
    stream.job = "4243"
    run_job(stream, AT - 40 * MINUTE_MS, AT - 6 * MINUTE_MS, AT, after_stop="hold")
    stream.stored()
    assert [f["node_id"] for f in hung(diagnose(store, RULES, AT, CATALOG))] == ["job:4243"]


def test_the_same_wobble_after_the_warm_up_is_the_existing_warning(tmp_path, store):
    start = AT - 40 * MINUTE_MS
    stream = Stream(tmp_path, store)
    run_job(stream, start, AT, AT, after_stop="hold", wobble_from=AT - 8 * MINUTE_MS)
    stream.stored()
    assert subhealth(diagnose(store, RULES, AT, CATALOG)) == NODES


def diagnose_cli(tmp_path, *options: str) -> subprocess.CompletedProcess:
    """`stethoscope diagnose --no-model` as an operator runs it, on an empty store."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "stethoscope.cli", "--dsn", f"chdb://{tmp_path / 'db'}"),
            *("diagnose", "--no-model", *options),
        ],
        capture_output=True,
        text=True,
        cwd=TOP,
        timeout=120,
        check=False,
    )


def test_a_warm_up_given_with_e_is_checked_as_the_inventorys_is(tmp_path):
    """`-e KEY=VALUE` gives a setting as the inventory does (README): out of range, exit 2 naming it."""
    done = diagnose_cli(tmp_path, "-e", "stethoscope_job_warmup=2d")
    assert done.returncode == 2, done.stderr
    assert "stethoscope_job_warmup" in done.stderr and "-e" in done.stderr


@pytest.mark.parametrize("value", ["-5m", "bogus", "2d", "true"])
def test_a_warm_up_setting_out_of_range_exits_2_naming_it(tmp_path, value):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    j-00:\n      stethoscope_node_key: 1\n"
        f"  vars:\n    stethoscope_job_warmup: {value!r}\n"
    )
    done = diagnose_cli(tmp_path, "--inventory", str(inventory))
    assert done.returncode == 2, done.stderr
    assert "stethoscope_job_warmup" in done.stderr
