# Copyright: stethoscope developers
# Apache License 2.0
"""RDMA suite: perftest clients (ib_write_lat, ib_read_lat, ib_write_bw) against a peer's server."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_runner import run_and_parse
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.perftest import parse_perftest

LATENCY_TESTS = ("ib_write_lat", "ib_read_lat", "ib_send_lat")


def client_argv(test, server, device, size, iterations, report_gbits=True):
    argv = [test, "-d", device, "-s", str(size), "-n", str(iterations), "-F"]
    if test not in LATENCY_TESTS and report_gbits:
        argv.append("--report_gbits")
    return [*argv, server]


def run(
    ctx,
    tests,
    server,
    peer,
    device,
    size,
    iterations,
    repetitions,
    fingerprint,
    max_rsd_percent,
    repetition_number=None,
):
    measurements, runs = [], []
    numbers = [repetition_number] if repetition_number else range(1, repetitions + 1)
    for repetition in numbers:
        for test in tests:
            argv = client_argv(test, server, device, size, iterations)
            parsed, out = run_and_parse(ctx, argv, parse_perftest, test)
            runs.append(
                {
                    "test": test,
                    "repetition": repetition,
                    "rc": parsed["rc"],
                    "incomplete": parsed["incomplete"],
                    "failure": parsed["failure"],
                }
            )
            if parsed["failed"] or parsed["rc"] != 0:
                raise CollectorError(
                    "%s to %s: %s" % (test, peer, parsed["failure"] or "exit code %s" % parsed["rc"]),
                    argv,
                    parsed["rc"],
                    out,
                    "",
                )
            if not parsed["rows"]:
                raise CollectorError("%s to %s: no result line" % (test, peer), argv, parsed["rc"], out, "")
            row = parsed["rows"][-1]
            labels = {"test": test, "peer": peer, "size": str(int(row["bytes"]))}
            if parsed["kind"] == "lat":
                for stat, key in (("typical", "t_typical_us"), ("p99", "p99_us"), ("p99_9", "p999_us")):
                    name = "bench_rdma_latency_p99_us" if stat == "p99" else "bench_rdma_latency_%s_us" % stat
                    measurements.append(
                        {
                            "metric_name": name,
                            "device": device,
                            "labels": labels,
                            "value": row[key],
                            "unit": "us",
                            "repetition": repetition,
                        }
                    )
            else:
                measurements.append(
                    {
                        "metric_name": "bench_rdma_bw_gbit_per_s",
                        "device": device,
                        "labels": labels,
                        "value": row["bw_average_gbit_per_s"],
                        "unit": "gbit_per_s",
                        "repetition": repetition,
                    }
                )
    bench, rows, stability = bench_result("network", measurements, fingerprint, max_rsd_percent)
    return bench, rows, stability, {"runs": runs}
