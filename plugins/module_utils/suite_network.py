# Copyright: stethoscope developers
# Apache License 2.0
"""RDMA suite: perftest clients (ib_write_lat, ib_read_lat, ib_write_bw) against a peer's server."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_runner import run_and_parse
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.perftest import parse_perftest

LATENCY_TESTS = ("ib_write_lat", "ib_read_lat", "ib_send_lat")
# The HCA port's RC retry and timeout counters (hw_counters), read before and after each client run:
# a pair whose queue pairs retried under the benchmark, by metric name.
RC_COUNTERS = (
    ("local_ack_timeout_err", "bench_rdma_rc_local_ack_timeouts"),
    ("rnr_nak_retry_err", "bench_rdma_rc_rnr_nak_retries"),
    ("packet_seq_err", "bench_rdma_rc_packet_seq_errors"),
    ("out_of_sequence", "bench_rdma_rc_out_of_sequence"),
)


def client_argv(test, server, device, size, iterations, report_gbits=True, port=None):
    argv = [test, "-d", device, "-s", str(size), "-n", str(iterations), "-F"]
    if test not in LATENCY_TESTS and report_gbits:
        argv.append("--report_gbits")
    if port:
        argv += ["-p", str(port)]
    return [*argv, server]


def rc_counters(ctx, device, hca_port):
    """{counter: value} of the port's RC counters, or None where the HCA has none (or no port given)."""
    if hca_port is None:
        return None
    base = "/sys/class/infiniband/%s/ports/%s/hw_counters/" % (device, hca_port)
    values = {}
    for name, _metric in RC_COUNTERS:
        raw = ctx.read(base + name)
        if raw is None or not raw.isdigit():
            return None
        values[name] = int(raw)
    return values


def _counter_deltas(before, after):
    if before is None or after is None:
        return None
    return {name: after[name] - before[name] for name, _metric in RC_COUNTERS}


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
    port=None,
    hca_port=None,
):
    measurements, runs = [], []
    numbers = [repetition_number] if repetition_number else range(1, repetitions + 1)
    for repetition in numbers:
        for test in tests:
            argv = client_argv(test, server, device, size, iterations, port=port)
            before = rc_counters(ctx, device, hca_port)
            parsed, out = run_and_parse(ctx, argv, parse_perftest, test)
            deltas = _counter_deltas(before, rc_counters(ctx, device, hca_port))
            runs.append(
                {
                    "test": test,
                    "peer": peer,
                    "repetition": repetition,
                    "rc": parsed["rc"],
                    "incomplete": parsed["incomplete"],
                    "failure": parsed["failure"],
                    "rc_counters": deltas,
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
            # no peer label: a pair's results compare with its class's other pairs (the peer is a fact)
            labels = {"test": test, "size": str(int(row["bytes"]))}
            for name, metric_name in RC_COUNTERS if deltas is not None else ():
                measurements.append(
                    {
                        "metric_name": metric_name,
                        "device": device,
                        "labels": labels,
                        "value": deltas[name],
                        "unit": "count",
                        "repetition": repetition,
                    }
                )
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
    pair = {"peer": peer, "server": server, "port": port, "device": device, "hca_port": hca_port}
    return bench, rows, stability, {"runs": runs, "ansible_facts": {"stethoscope_rdma_pair": pair}}
