# Copyright: stethoscope developers
# Apache License 2.0
"""NCCL suite: nccl-tests all_reduce_perf with NCCL_ALGO=Ring and Tree, repeated."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_runner import run_and_parse
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nccl_tests import parse_nccl_tests


def _name(binary, algo, launch):
    return "%s (NCCL_ALGO=%s, %s)" % (binary, algo, launch["topology"])


def _refuse_unmeasured(name, parsed, launch, argv, out):
    """A run that did not measure the bus asked for: a launch failure, corruption, fewer or more ranks
    than asked, a bus bandwidth of 0. Each is an error naming the run, never a baseline."""
    problem = None
    if parsed["failed"] or (parsed["rc"] != 0 and not parsed["rows"]):
        what = parsed["failure"] or "exit code %s" % parsed["rc"]
        problem = "%s%s" % ("" if parsed["rows"] else "launch failed: ", what)
    elif parsed["wrong"]:
        problem = "%d results #wrong: data corruption on the path" % parsed["wrong"]
    elif parsed["ranks"] is not None and parsed["ranks"] != launch["ranks"]:
        problem = "asked for %d ranks, %d ran" % (launch["ranks"], parsed["ranks"])
    elif parsed["avg_busbw_gb_per_s"] == 0:
        problem = "average bus bandwidth 0: nothing crossed a bus (one rank, or no peer reached)"
    if problem:
        raise CollectorError("%s: %s" % (name, problem), argv, parsed["rc"], out, "")


def run(ctx, binary, algos, launch, repetitions, fingerprint, max_rsd_percent):
    """launch: nccl_launch.plan(...). Every result is labelled with its rank count and topology, so the
    baseline compares an 8-GPU node with 8-GPU nodes and a 2-node run with 2-node runs."""
    measurements, latency, runs = [], {}, []
    run_labels = {"ranks": str(launch["ranks"]), "topology": launch["topology"]}
    for repetition in range(1, repetitions + 1):
        for algo in algos:
            argv = list(launch["argv"])
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
                    "ranks": launch["ranks"],
                    "topology": launch["topology"],
                    "rank_hosts": parsed["rank_hosts"],
                }
            )
            _refuse_unmeasured(_name(binary, algo, launch), parsed, launch, argv, _out)
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
                                "labels": dict(run_labels, algo=algo.lower(), size=size, placement=placement),
                                "value": row["%s_%s" % (placement, key)],
                            }
                        )
                    time_us = row["%s_time_us" % placement]
                    if time_us is not None:
                        latency.setdefault((algo.lower(), size, placement), []).append(time_us)
            if parsed["avg_busbw_gb_per_s"] is not None:
                measurements.append(
                    {
                        "metric_name": "bench_allreduce_busbw_gb_per_s",
                        "device": "node",
                        "labels": dict(run_labels, algo=algo.lower(), size="avg"),
                        "value": parsed["avg_busbw_gb_per_s"],
                        "unit": "gb_per_s",
                        "repetition": repetition,
                    }
                )
    for (algo, size, placement), times in latency.items():
        for repetition, value in enumerate(times, start=1):
            measurements.append(
                {
                    "metric_name": "bench_allreduce_latency_us",
                    "device": "node",
                    "labels": dict(run_labels, algo=algo, size=size, placement=placement),
                    "value": value,
                    "unit": "us",
                    "repetition": repetition,
                }
            )
    bench, rows, stability = bench_result("nccl", measurements, fingerprint, max_rsd_percent)
    # nccl-tests prints one time per size, the mean of its iterations (-n): no single collective's
    # time, so no distribution to take a p99 of. Over the repetitions: the median (above) and the
    # worst, named max (a nearest-rank p99 of fewer than 100 values is the max); a p99 across runs is
    # a rule's `aggregate: p99` over every repetition bench_results keeps.
    for (algo, size, placement), times in sorted(latency.items()):
        rows.append(
            metric(
                "bench_allreduce_latency_us",
                "node",
                max(times),
                dict(run_labels, algo=algo, size=size, placement=placement, stat="max"),
            )
        )
    return bench, rows, stability, {"runs": runs}


def recorded(result, fingerprint):
    """A multi-node run's result (registered on the node that launched it) as this node's: its
    measurements unchanged, this node's fingerprints, so each participant compares with its class."""
    bench = (result or {}).get("stethoscope_bench")
    if not isinstance(bench, dict) or bench.get("suite") != "nccl" or result.get("failed"):
        raise CollectorError("no NCCL result to record: the batch's run failed or did not run")
    fingerprint = fingerprint or {}
    own = dict(
        bench,
        class_fingerprint=fingerprint.get("class_fingerprint", ""),
        node_fingerprint=fingerprint.get("node_fingerprint", ""),
        fingerprint_detail=fingerprint.get("detail", {}),
    )
    extra = {"runs": result.get("runs", []), "recorded_from_run": True}
    return own, list(result.get("stethoscope_metrics") or []), list(result.get("stability") or []), extra
