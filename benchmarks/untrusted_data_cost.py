"""What the checks that keep node data from becoming code cost, each against its reference
in the same run:

- the stream's rows through the writer's check (`rows.split_metrics`, names included) against the
  same check without the names (the reference: values and times only, as before): one 5-second
  period of 2,000 eight-GPU nodes, the node part and 8 GPU parts (the telemetry set's slots);
- a finding's message rendered by `templating.render` (sandbox, watchdog, output and size bounds)
  against Jinja2's plain sandbox (the reference: the renderer before the bounds);
- a finding's vars file for ansible-runner (`untrusted_vars`, every string `!unsafe`) against
  `json.dumps` of the same (the reference: ansible-runner's own extra vars).

    python benchmarks/untrusted_data_cost.py [--repeats 7] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

TOP = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TOP))

from jinja2 import StrictUndefined  # noqa: E402
from jinja2.sandbox import SandboxedEnvironment  # noqa: E402
from provenance import write_results  # noqa: E402

from stethoscope.remediation.actions.playbook import untrusted_vars  # noqa: E402
from stethoscope.store import rows  # noqa: E402
from stethoscope.store.batch import MetricColumns  # noqa: E402
from stethoscope.telemetry.metric_set import load_sets  # noqa: E402
from stethoscope.templating import render  # noqa: E402
from stethoscope.timeutil import in_range  # noqa: E402

NODES, GPUS = 2_000, 8
MESSAGE = "{{ node_id }} {{ device }}: {{ value | int }} reallocated sectors (first seen {{ timestamp }})"
RENDERS = 2_000


def stream_period() -> MetricColumns:
    """One period of every node's node part and GPU parts, labelled as the collector labels them."""
    sets = load_sets()
    metric_set = sets["gpu_node"]
    now = int(time.time() * 1000)
    batch = MetricColumns()
    for node in range(NODES):
        for part in range(GPUS + 1):
            device = "node" if part == 0 else f"gpu{part - 1}"
            labels = {"source": "stream", "interval": "5s"}
            for name in metric_set.names(part):
                batch.append(f"node{node:04d}", name, device, labels, 1.0, now)
    return batch


def median_of(repeats: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def values_only(metrics: MetricColumns) -> bool:
    """The writer's check before names were checked: finite values, times the store can hold."""
    return all(map(math.isfinite, metrics.value)) and all(map(in_range, metrics.timestamp))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/untrusted_data_cost.json")
    args = parser.parse_args()

    period = stream_period()
    checked = median_of(args.repeats, lambda: rows.split_metrics(period))
    reference = median_of(args.repeats, lambda: values_only(period))

    context = {
        "node_id": "node07",
        "device": "sda",
        "value": 184.0,
        "values": {},
        "timestamp": "2026-12-06T04:00:00Z",
    }
    plain = SandboxedEnvironment(undefined=StrictUndefined)
    bounded_renders = median_of(args.repeats, lambda: [render(MESSAGE, context) for _ in range(RENDERS)])
    plain_renders = median_of(
        args.repeats, lambda: [plain.from_string(MESSAGE).render(**context) for _ in range(RENDERS)]
    )

    finding = {
        "finding_id": "f" * 16,
        "rule_id": "ssd_reallocated_sectors",
        "node_id": "node07",
        "device": "sda",
        "message": "node07 sda: 184 reallocated sectors",
        "evidence": json.dumps({"smart_reallocated_sector_ct": 184.0}),
        "actions": ["log", "alert", "playbook:remediate/drain.yml"],
    }
    as_unsafe = median_of(args.repeats, lambda: [untrusted_vars({"f": finding}) for _ in range(RENDERS)])
    as_json = median_of(args.repeats, lambda: [json.dumps({"f": finding}) for _ in range(RENDERS)])

    figures = {
        "stream_rows_per_period": len(period),
        "stream_check_ms": round(checked * 1000, 2),
        "stream_check_reference_ms": round(reference * 1000, 2),
        "stream_check_us_per_row": round(checked / len(period) * 1e6, 3),
        "render_us_each": round(bounded_renders / RENDERS * 1e6, 1),
        "render_reference_us_each": round(plain_renders / RENDERS * 1e6, 1),
        "vars_file_us_each": round(as_unsafe / RENDERS * 1e6, 1),
        "vars_json_reference_us_each": round(as_json / RENDERS * 1e6, 1),
        "repeats": args.repeats,
    }
    write_results(args.out, figures)
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
