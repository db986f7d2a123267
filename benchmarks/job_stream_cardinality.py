"""Memory one node key can make the collector hold: a node sends job-part datagrams, each
for a (job, rank) pair not seen before, through the collector's real receive path (MAC, freshness,
replay guard, rows); the sink takes the rows every FLUSH_EVERY datagrams (a second of a busy stream)
and drops them, so what stays is the per-stream state. Reports the process's resident memory and the
collector's per-(job, rank) structures after every step of pairs.

    python benchmarks/job_stream_cardinality.py [--pairs 100000] [--step 25000] [--out FILE]

Target: the replay guard's job streams for the node stay within its cap (4,096 by default), the
evictions are counted for that node, and memory stops growing with the pairs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from provenance import write_results  # noqa: E402

from stethoscope.store.writer import WriteReport  # noqa: E402
from stethoscope.telemetry import wire  # noqa: E402
from stethoscope.telemetry.keyring import Keyring  # noqa: E402
from stethoscope.telemetry.metric_set import load_sets  # noqa: E402
from stethoscope.telemetry.udp_collector import Collector  # noqa: E402

SECRET = b"job-stream-cardinality-secret-0123"
NODE = "node01"
FLUSH_EVERY = 5_000


def resident_mib() -> float:
    with open("/proc/self/statm", encoding="ascii") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def job_streams(collector: Collector) -> int:
    """The guard's job-part streams (every one belongs to the one node here)."""
    return sum(1 for stream in collector.guard._state if stream[1] == wire.JOB_PART)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=100_000, help="distinct (job, rank) pairs to send")
    parser.add_argument("--step", type=int, default=25_000, help="report after this many pairs")
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/job_stream_cardinality.json")
    args = parser.parse_args()
    metric_set = load_sets()["gpu_node"]
    collector = Collector(
        Keyring({1: NODE}, [SECRET]),
        {metric_set.id: metric_set},
        lambda batch: WriteReport(stored=len(batch.metrics)),
    )
    key = wire.node_secret(SECRET, NODE)
    values = [1.0] * len(metric_set.parts["job"])
    now_ms = int(time.time() * 1000)
    gc.collect()
    start_mib = resident_mib()
    started = time.perf_counter()
    steps = []
    for pair in range(args.pairs):
        job, rank = divmod(pair, 64)
        datagram = wire.encode(
            key, set_id=metric_set.id, node_key=1, part=wire.JOB_PART, boot_epoch=1, seq=0,
            ts_ms=now_ms, values=values, job=job, rank=rank, flags=wire.JOB_NUMERIC,
        )  # fmt: skip
        collector.handle(datagram, now_ms=now_ms)
        if (pair + 1) % FLUSH_EVERY == 0:
            collector.flush()
        if (pair + 1) % args.step == 0 or pair + 1 == args.pairs:
            collector.flush()
            gc.collect()
            steps.append(
                {
                    "pairs": pair + 1,
                    "resident_mib": round(resident_mib(), 1),
                    "growth_mib": round(resident_mib() - start_mib, 1),
                    "guard_job_streams": job_streams(collector),
                    "label_cache_entries": len(collector._labels),
                }
            )
            print(json.dumps(steps[-1]), flush=True)
    evicted = getattr(collector.guard, "evicted", {})
    result = {
        "pairs": args.pairs,
        "seconds": round(time.perf_counter() - started, 1),
        "resident_mib_at_start": round(start_mib, 1),
        "steps": steps,
        "kept": collector.stats.received[NODE],
        "job_streams_evicted_for_node": evicted.get(1, 0),
        "job_stream_cap": getattr(collector.guard, "max_job_streams", None),
        "target": "guard's job streams <= cap, evictions counted for the node, memory flat after the cap",
        "target_met": steps[-1]["guard_job_streams"] <= (getattr(collector.guard, "max_job_streams", 0) or 0)
        and evicted.get(1, 0) == args.pairs - steps[-1]["guard_job_streams"],
    }
    write_results(args.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
