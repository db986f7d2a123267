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
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.telemetry import wire  # noqa: E402

SECRET = b"stream-scale-benchmark-secret"
PERIOD = 5.0
SLOTS = 20


def node_name(index: int) -> str:
    return f"sim{index:05d}"


def generate(address: tuple[str, int], nodes: int, duration: float, paced: bool) -> dict:
    """Every node sends a new node-part sample once a period (at its own offset) and re-sends its
    previous 3; with `paced` false, the same datagrams as fast as possible (the ceiling run)."""
    from stethoscope.telemetry.metric_set import load_sets

    set_id = load_sets()["gpu_node"].id  # the set the collector knows (rules/telemetry.yml)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    keys = [wire.node_secret(SECRET, node_name(i)) for i in range(nodes)]
    history: list[list[bytes]] = [[] for _ in range(nodes)]
    boot = int(time.time())
    sent = samples = errors = 0
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
                try:
                    sock.sendto(datagram, address)
                    sent += 1
                except OSError:
                    errors += 1
        return {"sent": sent, "samples": 0, "errors": errors, "seconds": time.time() - start}
    # warm start, as agents that have run a while: each node holds its previous 3 samples (never sent
    # on their own), so every period carries 1 + REDUNDANCY datagrams per node from the first
    now_ms = int(time.time() * 1000)
    for i in range(nodes):
        for back in range(wire.REDUNDANCY, 0, -1):
            seq = wire.REDUNDANCY - back
            history[i].append(
                wire.encode(
                    keys[i],
                    set_id=set_id,
                    node_key=i,
                    part=0,
                    boot_epoch=boot,
                    seq=seq,
                    ts_ms=now_ms - int(back * PERIOD * 1000),
                    values=[float((i + seq + slot) % 97) for slot in range(SLOTS)],
                )
            )
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
            datagram = wire.encode(
                keys[i],
                set_id=set_id,
                node_key=i,
                part=0,
                boot_epoch=boot,
                seq=period_index,
                ts_ms=int(time.time() * 1000),
                values=[float((i + period_index + slot) % 97) for slot in range(SLOTS)],
            )
            samples += 1
            for copy in [datagram, *reversed(history[i])]:
                try:
                    sock.sendto(copy, address)
                    sent += 1
                except OSError:
                    errors += 1
            history[i] = [*history[i], datagram][-wire.REDUNDANCY :]
        time.sleep(0.01)
    seconds = time.time() - start
    # the agents go on re-sending after the measured run, so each sample gets its 1 + 3 copies
    for step in range(wire.REDUNDANCY):
        begin, done = time.time(), 0
        while done < nodes:
            due = min(nodes, int((time.time() - begin) / PERIOD * nodes) + 1)
            for i in range(done, due):
                for copy in reversed(history[i][step:]):
                    try:
                        sock.sendto(copy, address)
                    except OSError:
                        errors += 1
            done = due
            time.sleep(0.01)
    return {"sent": sent, "samples": samples, "errors": errors, "seconds": seconds}


def _udp_rcvbuf_errors() -> int:
    lines = [
        line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Udp:")
    ]
    header, values = lines[0], lines[1]
    return int(values[header.index("RcvbufErrors")])


def _spawn_generator(address, nodes: int, duration: float, paced: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--generate", f"{address[0]}:{address[1]}", str(nodes), str(duration)]
        + ([] if paced else ["--unpaced"]),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="4000,8000,16000", help="datagrams/s to try, comma-separated")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--generate", nargs=3, metavar=("HOST:PORT", "NODES", "SECONDS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--unpaced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        host, port = args.generate[0].rsplit(":", 1)
        result = generate((host, int(port)), int(args.generate[1]), float(args.generate[2]), not args.unpaced)
        print(json.dumps(result))
        return 0
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
