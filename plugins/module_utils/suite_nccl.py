# Copyright: stethoscope developers
# Apache License 2.0
"""NCCL suite: nccl-tests all_reduce_perf with NCCL_ALGO=Ring and Tree, repeated."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_runner import run_and_parse
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nccl_tests import parse_nccl_tests


def run(ctx, binary, args, algos, launcher, repetitions, fingerprint, max_rsd_percent):
    measurements, latency, runs = [], {}, []
    for repetition in range(1, repetitions + 1):
        for algo in algos:
            argv = [*list(launcher), binary, *list(args)]
            parsed, _out = run_and_parse(ctx, argv, parse_nccl_tests, binary, env={"NCCL_ALGO": algo})
            runs.append(
                {
                    "algo": algo,
                    "repetition": repetition,
                    "rc": parsed["rc"],
                    "wrong": parsed["wrong"],
                    "validated": parsed["validated"],
                    "avg_busbw_gb_per_s": parsed["avg_busbw_gb_per_s"],
                    "nccl_version": parsed["nccl_version"],
                }
            )
            if parsed["failed"] or (parsed["rc"] != 0 and not parsed["rows"]):
                what = parsed["failure"] or "exit code %s" % parsed["rc"]
                raise CollectorError(
                    "%s (NCCL_ALGO=%s): %s%s"
                    % (binary, algo, "" if parsed["rows"] else "launch failed: ", what),
                    argv,
                    parsed["rc"],
                    _out,
                    "",
                )
            if parsed["wrong"]:
                raise CollectorError(
                    "%s (NCCL_ALGO=%s): %d results #wrong: data corruption on the path"
                    % (binary, algo, parsed["wrong"]),
                    argv,
                    parsed["rc"],
                    _out,
                    "",
                )
            for row in parsed["rows"]:
                size = str(row["size"])
                for placement in ("oop", "ip"):  # out-of-place and in-place
                    for name, key in (
                        ("bench_allreduce_busbw_gb_per_s", "busbw"),
                        ("bench_allreduce_algbw_gb_per_s", "algbw"),
                    ):
                        if row["%s_%s" % (placement, key)] is None:
                            continue
                        measurements.append(
                            {
                                "metric_name": name,
                                "device": "node",
                                "unit": "gb_per_s",
                                "repetition": repetition,
                                "labels": {"algo": algo.lower(), "size": size, "placement": placement},
                                "value": row["%s_%s" % (placement, key)],
                            }
                        )
                latency.setdefault((algo.lower(), size), []).append(row["oop_time_us"])
            if parsed["avg_busbw_gb_per_s"] is not None:
                measurements.append(
                    {
                        "metric_name": "bench_allreduce_busbw_gb_per_s",
                        "device": "node",
                        "labels": {"algo": algo.lower(), "size": "avg"},
                        "value": parsed["avg_busbw_gb_per_s"],
                        "unit": "gb_per_s",
                        "repetition": repetition,
                    }
                )
    for (algo, size), times in latency.items():
        for repetition, value in enumerate(times, start=1):
            measurements.append(
                {
                    "metric_name": "bench_allreduce_latency_us",
                    "device": "node",
                    "labels": {"algo": algo, "size": size},
                    "value": value,
                    "unit": "us",
                    "repetition": repetition,
                }
            )
    bench, rows, stability = bench_result("nccl", measurements, fingerprint, max_rsd_percent)
    # nccl-tests time per size: the median over repetitions (above) and the max (with 3 there is no p99)
    for (algo, size), times in sorted(latency.items()):
        rows.append(
            metric(
                "bench_allreduce_latency_us", "node", max(times), {"algo": algo, "size": size, "stat": "max"}
            )
        )
    return bench, rows, stability, {"runs": runs}
