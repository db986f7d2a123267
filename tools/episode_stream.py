#!/usr/bin/env python3
"""The last 10 minutes of the 5-second stream for lab nodes, and 4 more ahead that repeat the last
one, from the learned diagnosis's episodes (stethoscope_training.episodes, calibrated on the real H200
capture), as NDJSON metric rows exactly as the stream collector stores them: for `make demo`, whose
lab nodes are only swept (a minute of `stethoscope agent` fills 12 of the model's 120 steps, and no
job runs in the lab).

Each node runs a job of its own; each gets a healthy training window, except those given --fault.

    python tools/episode_stream.py --nodes node01 node02 ... --fault node03=communication.rdma_drop_storm \
        | stethoscope ingest -
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from stethoscope.timeutil import now_ms
from stethoscope_training import episodes

JOB = "4242"
# the episode's 10 minutes end now; its last minute then repeats for 4 more (ingest accepts rows up
# to 5 min ahead), as a fleet whose agents keep sending would: the read commands after the demo see
# the same state instead of a stream that stopped (UNKNOWN within 25 s) moments ago
TAIL_MINUTES = 4


def rows(nodes: list[str], faults: dict[str, str], seed: int, end_ms: int) -> list[dict]:
    data = episodes.generate(seed, 2 * len(nodes))
    # windows whose last minute has every feature: a gap there reads as a silent metric (UNKNOWN), and
    # a job that reports its step time only (as some episodes do) would hide a fault's collective time
    whole = data.mask[:, -12:, :].min(axis=(1, 2)) > 0
    healthy = iter(np.flatnonzero((data.family == "healthy.training") & whole))
    out = []
    for node in nodes:
        family = faults.get(node)
        if family is None:
            index = int(next(healthy))
        else:
            if family not in set(data.family):
                raise SystemExit(f"episode_stream: no family {family!r} (one of {sorted(set(data.family))})")
            matching = np.flatnonzero((data.family == family) & whole)
            if not len(matching):
                raise SystemExit(f"episode_stream: no {family!r} episode has all features in its last minute")
            index = int(matching[np.argmax(data.severity[matching])])  # the clearest case
        window = data.to_rows(index, node, end_ms)
        last_minute = [row for row in window if row["timestamp"] > end_ms - 60_000]
        tail = [
            {**row, "timestamp": row["timestamp"] + minute * 60_000}
            for minute in range(1, TAIL_MINUTES + 1)
            for row in last_minute
        ]
        for row in window + tail:
            if "job" in row["labels"]:  # episodes are independent nodes, not one job's ranks
                row["labels"] = {**row["labels"], "job": f"{JOB}-{node}"}
            out.append({**row, "timestamp": row["timestamp"] / 1000})  # ingest reads epoch seconds
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", nargs="+", required=True, help="lab node ids")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NODE=FAMILY",
        help="e.g. node03=communication.rdma_drop_storm",
    )
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    faults = {}
    for pair in args.fault:
        node, sep, family = pair.partition("=")
        if not sep:
            parser.error(f"--fault {pair!r}: expected NODE=FAMILY")
        faults[node] = family
    end = now_ms()
    for row in rows(args.nodes, faults, args.seed, end):
        sys.stdout.write(json.dumps(row, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
