"""Store latency of the stream: from a sample's timestamp to its row being queryable, with `serve`'s
collector and diagnosis cycle running in one process on the embedded database, at N simulated nodes
sending the node part every 5 s (with resends), played by stream_scale.py's load generator.

    python benchmarks/store_latency.py [--nodes 2000] [--duration 120] [--cycle 10] [--out FILE]

A prober polls the store every 0.2 s for rows newer than the last it saw: a sample's latency is the
poll that first returns it minus its timestamp (so up to 0.2 s of it is the probe's own).
Target: p50 <= 2 s, p99 <= 10 s at 2,000 nodes with the diagnosis cycle running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.catalog import Catalog  # noqa: E402
from stethoscope.diagnosis.rules import load_rules  # noqa: E402
from stethoscope.remediation.cycle import Cycles  # noqa: E402
from stethoscope.serve import Server  # noqa: E402
from stethoscope.store.client import Store  # noqa: E402
from stethoscope.telemetry.keyring import Keyring  # noqa: E402
from stethoscope.telemetry.metric_set import load_sets  # noqa: E402

SECRET = b"stream-scale-benchmark-secret"  # the generator's


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--duration", type=float, default=120.0)
    parser.add_argument("--cycle", type=float, default=10.0, help="seconds between diagnosis cycles")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="store-latency-"))
    catalog = Catalog.load()
    rules = load_rules(TOP / "rules", catalog).rules
    metric_set = load_sets()["gpu_node"]
    dsn = f"chdb://{work / 'db'}"
    server = Server(
        store=Store(dsn, "latency"),
        spool_dir=work / "spool",
        keyring=Keyring({i: f"sim{i:05d}" for i in range(args.nodes)}, [SECRET]),
        sets={metric_set.id: metric_set},
        listen=("127.0.0.1", 0),
        http=None,
        interval=args.cycle,
        rules=lambda: rules,
        catalog=catalog,
        cycles=Cycles(dsn, "latency", catalog, long_running=True),
    ).start()
    assert server.collector is not None
    cycles = threading.Thread(target=server.run, daemon=True)
    cycles.start()
    latencies: list[tuple[int, float]] = []  # (sample timestamp ms, seconds until queryable)
    stop = threading.Event()

    def probe() -> None:
        since = int(time.time() * 1000) - 60_000
        while not stop.is_set():
            rows = server.store.query(
                "SELECT toUnixTimestamp64Milli(timestamp) FROM latency.metrics "
                "WHERE metric_name = 'gpu_temperature_celsius' AND labels['source'] = 'stream' "
                "AND timestamp > fromUnixTimestamp64Milli({since:Int64})",
                {"since": since},
            )
            seen = time.time() * 1000
            for (ts,) in rows:
                latencies.append((ts, (seen - ts) / 1000))
                since = max(since, ts)
            stop.wait(0.2)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    host, port = server.collector.address
    started_ms = int(time.time() * 1000)
    generator = subprocess.run(
        [
            sys.executable,
            str(TOP / "benchmarks/stream_scale.py"),
            "--generate",
            f"{host}:{port}",
            str(args.nodes),
            str(args.duration),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(TOP)},
        check=True,
    )
    time.sleep(3)
    stop.set()
    prober.join()
    server.stop_event.set()
    cycles.join()
    server.stop()
    sent = json.loads(generator.stdout)
    # the generator's warm-start samples (stamped before the run) are not the steady state
    steady = sorted(latency for ts, latency in latencies if ts >= started_ms)
    figures = {
        "nodes": args.nodes,
        "seconds": round(sent["seconds"], 1),
        "datagrams_per_s": round(sent["sent"] / sent["seconds"]),
        "samples_measured": len(steady),
        "latency_p50_s": round(statistics.median(steady), 3) if steady else None,
        "latency_p99_s": round(steady[int(0.99 * (len(steady) - 1))], 3) if steady else None,
        "latency_max_s": round(steady[-1], 3) if steady else None,
        "diagnosis_cycles": server.state.cycles,
        "diagnosis_cycle_failures": server.state.failures,
        "rules": len(rules),
        "spooled_rows": server.collector.stats.spooled,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(figures, indent=1))
    if not steady:  # e.g. the generator's metric set is not the collector's: every datagram refused
        print("store_latency: no sample reached the store; nothing was measured", file=sys.stderr)
        return 1
    if args.out:
        write_results(args.out, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
