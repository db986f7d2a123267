"""Scale of the stream's collector on this machine: does it hold N datagrams/s for 60 s with no sample
lost and every sample stored? A bounded load generator (its own process) plays N x 5 s / 4 simulated
nodes sending the node part with its 3 resends, each node at its own offset in the period, on
loopback; the collector (receive/decode thread + writing thread, embedded ClickHouse) runs here.
The same run measures the raw loopback UDP receive rate (a bare Python recv loop against the
generator at full speed) as the ceiling.

    python benchmarks/stream_scale.py [--rates 4000,8000,16000] [--duration 60] [--out FILE]

Target: 16,000 datagrams/s for 60 s, 0 samples lost, every sample stored. After the
measured seconds the generator goes on re-sending for 3 periods (as running agents would), so the
last samples get their copies too; `datagrams_sent` counts the measured seconds only.

With `--nodes N[,N...] --gpus G` each run is one fleet instead of a rate: each node sends, as the
shipped agent does (telemetry/agent.py `tick`), its node part and G GPU parts every period, each part
followed by its previous 3 samples, to one collector at the defaults `stethoscope collector` and serve
start it with (flush every second, WRITE_TIMEOUT). It reports the rows spooled, samples and rows stored
against those sent, the process's CPU and sample -> queryable latency two ways: each row's insert commit
(the Writer's insert returned: ClickHouse shows an insert's rows to every query from then on) minus its
sample's timestamp, and a probe that asks the store once a second for each (node, part)'s newest sample
(an upper bound, one probe interval coarse). `--diagnose-beside` runs the diagnosis cycle (evaluate_all
over the shipped rules) back to back on the same store, in a second run of each fleet, and reports its
cycle times.

    python benchmarks/stream_scale.py --nodes 1000,2000 --gpus 8 [--diagnose-beside] [--out FILE]

Target: 2,000 eight-GPU nodes, 0 rows spooled, every sample stored, p99 sample -> queryable <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.telemetry import wire  # noqa: E402

SECRET = b"stream-scale-benchmark-secret"
PERIOD = 5.0
SLOTS = 20
GPU_SLOTS = 14  # rules/telemetry.yml gpu_node's gpu part
PROBE_INTERVAL = 1.0
COMMIT_STRIDE = 16  # one row in 16 timed at its commit


def node_name(index: int) -> str:
    return f"sim{index:05d}"


def _values(node: int, seq: int, part: int) -> list[float]:
    slots = SLOTS if part == wire.NODE_PART else GPU_SLOTS
    return [float((node + seq + part + slot) % 97) for slot in range(slots)]


def generate(address: tuple[str, int], nodes: int, duration: float, paced: bool, gpus: int = 0) -> dict:
    """Every node sends a new sample of each part (the node part, then `gpus` GPU parts) once a period
    (at its own offset), each followed by that part's previous 3, as the agent's `tick` does; with
    `paced` false, node-part datagrams as fast as possible (the ceiling run)."""
    from stethoscope.telemetry.metric_set import load_sets

    set_id = load_sets()["gpu_node"].id  # the set the collector knows (rules/telemetry.yml)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    keys = [wire.node_secret(SECRET, node_name(i)) for i in range(nodes)]
    parts = range(1 + gpus)
    # node -> part -> its previous samples, oldest first
    history: list[list[list[bytes]]] = [[[] for _ in parts] for _ in range(nodes)]
    boot = int(time.time())
    sent = samples = errors = 0

    def send(datagram: bytes) -> None:
        nonlocal sent, errors
        try:
            sock.sendto(datagram, address)
            sent += 1
        except OSError:
            errors += 1

    def encode(node: int, part: int, seq: int, ts_ms: int) -> bytes:
        return wire.encode(
            keys[node],
            set_id=set_id,
            node_key=node,
            part=part,
            boot_epoch=boot,
            seq=seq,
            ts_ms=ts_ms,
            values=_values(node, seq, part),
        )

    if not paced:  # the ceiling: datagrams made beforehand, sent back to back
        pool = [
            wire.encode(
                keys[i],
                set_id=set_id,
                node_key=i,
                part=0,
                boot_epoch=boot,
                seq=0,
                ts_ms=0,
                values=[0.0] * SLOTS,
            )
            for i in range(min(nodes, 2000))
        ]
        start = time.time()
        while time.time() - start < duration:
            for datagram in pool:
                send(datagram)
        return {"sent": sent, "samples": 0, "errors": errors, "seconds": time.time() - start}
    # warm start, as agents that have run a while: each node holds its previous 3 samples of each part
    # (never sent on their own), so every period carries 1 + REDUNDANCY datagrams per part from the first
    now_ms = int(time.time() * 1000)
    for i in range(nodes):
        for back in range(wire.REDUNDANCY, 0, -1):
            seq = wire.REDUNDANCY - back
            for part in parts:
                history[i][part].append(encode(i, part, seq, now_ms - int(back * PERIOD * 1000)))
    samples = nodes * wire.REDUNDANCY
    first = samples
    start = time.time()
    while True:
        elapsed = time.time() - start
        if elapsed >= duration:
            break
        # node i's slot in each period is i/nodes of it: samples made by now, evenly spread
        target = first + int(elapsed / PERIOD * nodes)
        while samples < target:
            i, period_index = samples % nodes, samples // nodes
            ts_ms = int(time.time() * 1000)
            samples += 1
            for part in parts:
                datagram = encode(i, part, period_index, ts_ms)
                for copy in [datagram, *reversed(history[i][part])]:
                    send(copy)
                history[i][part] = [*history[i][part], datagram][-wire.REDUNDANCY :]
        time.sleep(0.01)
    seconds = time.time() - start
    measured = sent
    # the agents go on re-sending after the measured run, so each sample gets its 1 + 3 copies
    for step in range(wire.REDUNDANCY):
        begin, done = time.time(), 0
        while done < nodes:
            due = min(nodes, int((time.time() - begin) / PERIOD * nodes) + 1)
            for i in range(done, due):
                for part in parts:
                    for copy in reversed(history[i][part][step:]):
                        send(copy)
            done = due
            time.sleep(0.01)
    # samples: node-periods (each carries 1 + gpus parts); "sent": datagrams of the measured seconds
    return {"sent": measured, "samples": samples, "errors": errors, "seconds": seconds}


def _udp_rcvbuf_errors() -> int:
    lines = [
        line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Udp:")
    ]
    header, values = lines[0], lines[1]
    return int(values[header.index("RcvbufErrors")])


def _spawn_generator(address, nodes: int, duration: float, paced: bool, gpus: int = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--generate", f"{address[0]}:{address[1]}", str(nodes), str(duration)]
        + ([] if paced else ["--unpaced"])
        + (["--gpus", str(gpus)] if gpus else []),
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TOP)},
    )


def raw_ceiling(seconds: float = 5.0) -> dict:
    """A bare recv loop (no decoding) against the generator at full speed: loopback's ceiling here."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)  # SO_RCVBUFFORCE
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(1.0)
    generator = _spawn_generator(sock.getsockname(), 20_000, seconds, paced=False)
    count, first, last = 0, None, None
    while True:
        try:
            sock.recv(2048)
        except TimeoutError:
            if generator.poll() is not None:
                break
            continue
        last = time.time()
        first = first or last
        count += 1
    sent = json.loads(generator.stdout.read())
    span = (last - first) if first and last else seconds
    return {"received_per_s": round(count / span), "sent_per_s": round(sent["sent"] / sent["seconds"])}


def hold(rate: int, duration: float) -> dict:
    from stethoscope.store.client import Store
    from stethoscope.store.writer import Writer
    from stethoscope.telemetry.keyring import Keyring
    from stethoscope.telemetry.metric_set import load_sets
    from stethoscope.telemetry.udp_collector import WRITE_TIMEOUT, Collector

    nodes = int(rate * PERIOD / (1 + wire.REDUNDANCY))
    work = Path(tempfile.mkdtemp(prefix="stream-scale-"))
    holder = Store(f"chdb://{work / 'db'}", "scale").open()
    holder.ensure_schema()
    metric_set = load_sets()["gpu_node"]
    keyring = Keyring({i: node_name(i) for i in range(nodes)}, [SECRET])
    writer = Writer(holder.dsn, work / "spool", timeout=WRITE_TIMEOUT)
    collector = Collector(keyring, {metric_set.id: metric_set}, writer.write).start()
    drops0 = _udp_rcvbuf_errors()
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    generator = _spawn_generator(collector.address, nodes, duration, paced=True)
    sent = json.loads(generator.communicate()[0])
    time.sleep(2 * collector.flush_interval)
    collector.stop()
    # a write that ran past the writer's timeout was spooled (acknowledged): store it before counting
    from stethoscope.store.spool import Spool

    spool = Spool(work / "spool")
    replayed = 0
    while spool.pending_rows():
        replayed += spool.replay(holder).rows
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    drops = _udp_rcvbuf_errors() - drops0
    stored = holder.query(
        "SELECT uniqExact(node_id, timestamp) FROM scale.metrics "
        "WHERE metric_name = 'gpu_temperature_celsius' AND labels['source'] = 'stream'"
    )[0]
    # FINAL: a write that timed out (spooled) and landed later is the same row twice until a merge
    rows = holder.query("SELECT count() FROM scale.metrics FINAL WHERE labels['source'] = 'stream'")[0][0]
    holder.close()
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    stats = collector.stats
    return {
        "rate_target_per_s": rate,
        "nodes": nodes,
        "seconds": round(sent["seconds"], 1),
        "datagrams_sent": sent["sent"],
        "datagrams_sent_per_s": round(sent["sent"] / sent["seconds"]),
        "datagrams_received": stats.datagrams,
        "kernel_rcvbuf_drops": drops,
        "samples_sent": sent["samples"],
        "samples_stored": stored[0],
        "samples_missing": sent["samples"] - stored[0],
        "samples_counted_lost": sum(collector.guard.lost.values()),
        "rows_stored": rows,
        "rows_expected": sent["samples"] * SLOTS,
        "spooled_rows": stats.spooled,
        "replayed_after_stop": replayed,
        "write_errors": stats.write_errors,
        "collector_cpu_percent_of_one_core": round(100 * cpu / sent["seconds"], 1),
        "held": sent["samples"] == stored[0] and rows == sent["samples"] * SLOTS,
    }


def _percentiles(latencies_ms: list[float] | Any) -> dict:
    import numpy as np

    values = np.asarray(latencies_ms, dtype=float)
    if not len(values):
        return {"count": 0}
    p50, p99 = np.percentile(values, [50, 99])
    return {
        "count": len(values),
        "p50_s": round(float(p50) / 1000, 3),
        "p99_s": round(float(p99) / 1000, 3),
        "max_s": round(float(values.max()) / 1000, 3),
    }


class CommitClock:
    """Wraps the Writer's write: for each stream row an insert stored (one in COMMIT_STRIDE), its
    commit time minus its sample's timestamp (spooled rows are not queryable yet: counted, not timed).
    Samples older than `since_ms` (the agents' history before the run, first heard as resends) are
    not timed."""

    def __init__(self, write: Callable) -> None:
        self.write = write
        self.since_ms = 2**62  # set when the generator starts
        self.latencies: list[Any] = []
        self.write_seconds: list[float] = []
        self.batch_rows: list[int] = []

    def __call__(self, batch: Any) -> Any:
        import numpy as np

        # every COMMIT_STRIDE-th row: a sample's rows share its timestamp, and timing each row would
        # cost the collector's process a Python pass over every row (the GIL its receiving thread needs)
        timestamps = batch.metrics.timestamp[::COMMIT_STRIDE]
        labels = batch.metrics.labels[::COMMIT_STRIDE]
        began = time.time()
        report = self.write(batch)
        committed_ms = time.time() * 1000
        self.write_seconds.append(committed_ms / 1000 - began)
        self.batch_rows.append(len(batch.metrics))
        if report.stored and not report.error:
            stream = np.fromiter(
                (
                    ts
                    for ts, label in zip(timestamps, labels, strict=True)
                    if ts >= self.since_ms and label.get("source") == "stream"
                ),
                dtype=np.int64,
            )
            self.latencies.append(committed_ms - stream)
        return report

    def figures(self) -> dict:
        import numpy as np

        rows = np.concatenate(self.latencies) if self.latencies else []
        return {
            "commit": _percentiles(rows),
            "writes": len(self.write_seconds),
            "write_seconds": _percentiles([1000 * s for s in self.write_seconds]),
            "rows_per_write_median": int(np.median(self.batch_rows)) if self.batch_rows else 0,
        }


class Probe(threading.Thread):
    """Once a second, each (node, part)'s newest stream sample in the store: a newer one than last
    time, and those a period apart between it and the last one seen, became queryable by the time
    the query returned."""

    def __init__(self, store: Any) -> None:
        super().__init__(name="probe", daemon=True)
        self.store, self.since_ms = store, 2**62  # set when the generator starts
        self.newest: dict[tuple[str, str], int] = {}
        self.latencies: list[float] = []
        self.query_seconds: list[float] = []
        self.stop = threading.Event()

    def run(self) -> None:
        sql = (
            "SELECT node_id, device, toUnixTimestamp64Milli(max(timestamp)) "
            f"FROM {self.store.database}.metrics "
            "WHERE metric_name = 'gpu_temperature_celsius' AND labels['source'] = 'stream' "
            "AND timestamp >= fromUnixTimestamp64Milli({since:Int64}) GROUP BY node_id, device"
        )
        while not self.stop.wait(PROBE_INTERVAL):
            began = time.time()
            rows = self.store.query(sql, {"since": self.since_ms})
            seen_ms = time.time() * 1000
            self.query_seconds.append(seen_ms / 1000 - began)
            for node, device, newest in rows:
                ts = int(newest)
                key = (node, device)
                if ts > self.newest.get(key, self.since_ms):
                    if key in self.newest:  # the first sight of a series says nothing of its delay
                        # each sample since the last seen, a period apart, became visible now
                        steps = max(1, round((ts - self.newest[key]) / (PERIOD * 1000)))
                        self.latencies.extend(seen_ms - ts + k * PERIOD * 1000 for k in range(steps))
                    self.newest[key] = ts

    def figures(self) -> dict:
        return {
            "probe": _percentiles(self.latencies),
            "probe_interval_s": PROBE_INTERVAL,
            "probe_query_seconds": _percentiles([1000 * s for s in self.query_seconds]),
        }


class DiagnosisLoop(threading.Thread):
    """The diagnosis cycle's rules (evaluate_all over the shipped rules) on the store, a cycle begun
    every `every` seconds (serve's `--interval`), or back to back with 0."""

    def __init__(self, store: Any, every: float = 0.0) -> None:
        from stethoscope.catalog import Catalog
        from stethoscope.diagnosis.rules import load_rules
        from stethoscope.paths import project_root

        super().__init__(name="diagnosis", daemon=True)
        loaded = load_rules(project_root() / "rules", Catalog.load())
        assert not loaded.errors, loaded.errors
        self.store, self.rules, self.every = store, loaded.rules, every
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        from stethoscope.diagnosis.engine import evaluate_all

        while not self.stop.is_set():
            wall, cpu = time.time(), time.thread_time()
            evaluation = evaluate_all(self.store, self.rules, int(time.time() * 1000))
            self.walls.append(time.time() - wall)
            self.cpus.append(time.thread_time() - cpu)
            self.failures += len(evaluation.failures)
            self.stop.wait(max(0.0, wall + self.every - time.time()))

    def figures(self) -> dict:
        import numpy as np

        return {
            "rules": len(self.rules),
            "every_s": self.every,
            "cycles": len(self.walls),
            "cycle_wall_s_median": round(float(np.median(self.walls)), 2) if self.walls else None,
            "cycle_wall_s_max": round(max(self.walls), 2) if self.walls else None,
            "cycle_python_cpu_s_median": round(float(np.median(self.cpus)), 2) if self.cpus else None,
            "rule_failures": self.failures,
        }


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads: id -> (name as the kernel knows it, CPU seconds so far)."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        threads[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return threads


def cpu_by_thread_name(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """Percent of one core by thread name between two `thread_cpu` snapshots; threads that began and
    ended between them (a write's own thread) are in the process total only."""
    spent: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        spent[name] = spent.get(name, 0.0) + cpu - before.get(tid, (name, 0.0))[1]
    return {name: round(100 * cpu / seconds, 1) for name, cpu in sorted(spent.items(), key=lambda kv: -kv[1])}


def fleet(
    nodes: int, gpus: int, duration: float, diagnose: bool, flush_interval: float | None, every: float
) -> dict:
    """One collector (as `stethoscope collect` starts it, flushing every `flush_interval`) for `nodes`
    nodes of `gpus` GPU parts each; with `diagnose`, the rules evaluated on the same store meanwhile,
    a cycle begun every `every` seconds (0: back to back)."""
    from stethoscope.store.client import Store
    from stethoscope.store.spool import Spool
    from stethoscope.store.writer import Writer
    from stethoscope.telemetry.keyring import Keyring
    from stethoscope.telemetry.metric_set import load_sets
    from stethoscope.telemetry.udp_collector import WRITE_TIMEOUT, Collector

    metric_set = load_sets()["gpu_node"]
    assert len(metric_set.parts["node"]) == SLOTS and len(metric_set.parts["gpu"]) == GPU_SLOTS
    work = Path(tempfile.mkdtemp(prefix="stream-scale-"))
    holder = Store(f"chdb://{work / 'db'}", "scale").open()
    holder.ensure_schema()
    keyring = Keyring({i: node_name(i) for i in range(nodes)}, [SECRET])
    clock = CommitClock(Writer(holder.dsn, work / "spool", timeout=WRITE_TIMEOUT).write)
    settings = {} if flush_interval is None else {"flush_interval": flush_interval}
    collector = Collector(keyring, {metric_set.id: metric_set}, clock, **settings).start()
    probe = Probe(holder.reader())
    beside = DiagnosisLoop(holder, every) if diagnose else None
    drops0 = _udp_rcvbuf_errors()
    usage0, threads0 = resource.getrusage(resource.RUSAGE_SELF), thread_cpu()
    clock.since_ms = probe.since_ms = int(time.time() * 1000)
    probe.start()
    if beside is not None:
        beside.start()
    generator = _spawn_generator(collector.address, nodes, duration, paced=True, gpus=gpus)
    sent = json.loads(generator.communicate()[0])
    time.sleep(2 * collector.flush_interval)
    for thread in (probe, beside):
        if thread is not None:
            thread.stop.set()
            thread.join()
    probe.store.close()
    collector.stop()
    usage1, threads1 = resource.getrusage(resource.RUSAGE_SELF), thread_cpu()
    spool = Spool(work / "spool")
    replayed = 0
    while spool.pending_rows():  # spooled rows are acknowledged: stored before counting
        replayed += spool.replay(holder).rows
    drops = _udp_rcvbuf_errors() - drops0
    stream = "labels['source'] = 'stream'"
    stored = holder.query(
        f"SELECT uniqExact(node_id, device, timestamp) FROM scale.metrics "
        f"WHERE metric_name = 'gpu_temperature_celsius' AND {stream}"
    )[0][0]
    rows = holder.query(f"SELECT count() FROM scale.metrics FINAL WHERE {stream}")[0][0]
    holder.close()
    cpu = (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime)
    stats = collector.stats
    samples_sent = sent["samples"] * (1 + gpus)
    rows_expected = sent["samples"] * (SLOTS + gpus * GPU_SLOTS)
    latency = {**clock.figures(), **probe.figures()}
    figures = {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "diagnosis_beside": diagnose,
        "collector_settings": {
            "flush_interval_s": collector.flush_interval,
            "write_timeout_s": WRITE_TIMEOUT,
            "rcvbuf_bytes": collector.rcvbuf,
        },
        "seconds": round(sent["seconds"], 1),
        "datagrams_sent": sent["sent"],
        "datagrams_sent_per_s": round(sent["sent"] / sent["seconds"]),
        "datagrams_received": stats.datagrams,
        "duplicates_dropped": stats.duplicates,
        "kernel_rcvbuf_drops": drops,
        "samples_sent": samples_sent,
        "samples_stored": stored,
        "samples_missing": samples_sent - stored,
        "samples_counted_lost": sum(collector.guard.lost.values()),
        "rows_stored": rows,
        "rows_expected": rows_expected,
        "rows_per_s": round(rows_expected / sent["seconds"]),
        "spooled_rows": stats.spooled,
        "replayed_after_stop": replayed,
        "write_errors": stats.write_errors,
        "process_cpu_percent_of_one_core": round(100 * cpu / sent["seconds"], 1),
        # what the machine's load cannot stretch: CPU per row stored (receive, decode, insert, merges)
        "process_cpu_seconds_per_million_rows": round(cpu / rows * 1e6, 1) if rows else None,
        # by thread name: ClickHouse's pools (MergeMutate: merges); a Python thread that has called into
        # the embedded engine carries the name the engine gave it
        "cpu_percent_by_thread": cpu_by_thread_name(threads0, threads1, sent["seconds"]),
        "sample_to_queryable": latency,
        "diagnosis": beside.figures() if beside is not None else None,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }
    figures["held"] = (
        stored == samples_sent
        and rows == rows_expected
        and stats.spooled == 0
        and latency["commit"].get("p99_s", 99) <= 2.0
    )
    return figures


def fleets(args: argparse.Namespace) -> int:
    """Each fleet size alone and, with --diagnose-beside, again with the diagnosis cycle beside."""
    runs = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        for diagnose in (False, True) if args.diagnose_beside else (False,):
            run = fleet(nodes, args.gpus, args.duration, diagnose, args.flush_interval, args.diagnose_every)
            runs.append(run)
            print(json.dumps(run), flush=True)
    held = [run["nodes"] for run in runs if run["held"]]
    figures = {"runs": runs, "largest_fleet_held": max(held, default=0), "cpus": os.cpu_count()}
    print(json.dumps({"largest_fleet_held": figures["largest_fleet_held"]}))
    if args.out:
        write_results(args.out, figures)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="4000,8000,16000", help="datagrams/s to try, comma-separated")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--nodes", help="fleets of these many nodes, comma-separated, instead of --rates")
    parser.add_argument("--gpus", type=int, default=0, help="GPU parts per node (with --nodes)")
    parser.add_argument(
        "--diagnose-beside",
        action="store_true",
        help="each fleet twice: alone, then with the diagnosis cycle on the store meanwhile",
    )
    parser.add_argument(
        "--diagnose-every",
        type=float,
        default=0.0,
        help="with --diagnose-beside, begin a cycle every these many seconds (serve: 60); 0: back to back",
    )
    parser.add_argument(
        "--flush-interval",
        type=float,
        default=None,
        help="the collector's flush interval in seconds (default: the collector's own)",
    )
    parser.add_argument(
        "--generate", nargs=3, metavar=("HOST:PORT", "NODES", "SECONDS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--unpaced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        host, port = args.generate[0].rsplit(":", 1)
        result = generate(
            (host, int(port)), int(args.generate[1]), float(args.generate[2]), not args.unpaced, args.gpus
        )
        print(json.dumps(result))
        return 0
    if args.nodes:
        return fleets(args)
    figures = {"raw_loopback": raw_ceiling(), "runs": []}
    print(json.dumps(figures["raw_loopback"]), flush=True)
    for rate in (int(r) for r in args.rates.split(",")):
        run = hold(rate, args.duration)
        figures["runs"].append(run)
        print(json.dumps(run), flush=True)
    held = [run["rate_target_per_s"] for run in figures["runs"] if run["held"]]
    figures["highest_rate_held_per_s"] = max(held, default=0)
    figures["cpus"] = os.cpu_count()
    print(json.dumps({"highest_rate_held_per_s": figures["highest_rate_held_per_s"]}))
    if args.out:
        write_results(args.out, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
