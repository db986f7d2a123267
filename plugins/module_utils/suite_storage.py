# Copyright: stethoscope developers
# Apache License 2.0
"""Storage suite: fio 4k random read (iodepth 64, libaio, direct), repeated; and a sustained write
whose latency log shows when the drive falls off its cliff."""

from __future__ import annotations

import os

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_runner import run_and_parse
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fio_json import parse_fio_json
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fio_latency_log import (
    latency_jump,
    parse_lat_log,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric


def is_block_device(path):
    return path.startswith("/dev/")


def randread_argv(filename, size, runtime, iodepth, block_size, direct, ioengine):
    return [
        "fio",
        "--name=randread",
        "--filename=%s" % filename,
        "--rw=randread",
        "--bs=%s" % block_size,
        "--iodepth=%d" % iodepth,
        "--ioengine=%s" % ioengine,
        "--direct=%d" % int(direct),
        "--size=%s" % size,
        "--runtime=%d" % runtime,
        "--time_based",
        "--numjobs=1",
        "--group_reporting",
        "--output-format=json",
    ]


def run_randread(
    ctx,
    filename,
    size,
    runtime,
    iodepth,
    block_size,
    direct,
    ioengine,
    repetitions,
    fingerprint,
    max_rsd_percent,
    device_label,
):
    measurements, runs = [], []
    argv = randread_argv(filename, size, runtime, iodepth, block_size, direct, ioengine)
    for repetition in range(1, repetitions + 1):
        parsed, out = run_and_parse(ctx, argv, parse_fio_json, "fio")
        if parsed["rc"] != 0 or not parsed["jobs"] or parsed["jobs"][0].get("error"):
            raise CollectorError(
                "fio: exit code %s, job error %s"
                % (parsed["rc"], parsed["jobs"][0].get("error") if parsed["jobs"] else "none"),
                argv,
                parsed["rc"],
                out,
                "",
            )
        read = parsed["jobs"][0].get("read")
        if not read:
            raise CollectorError("fio: the randread job read nothing", argv, parsed["rc"], out, "")
        labels = {"bs": block_size, "iodepth": str(iodepth)}
        measurements.append(
            {
                "metric_name": "bench_fio_randread_iops",
                "device": device_label,
                "labels": labels,
                "value": read["iops"],
                "unit": "iops",
                "repetition": repetition,
            }
        )
        for stat, name in (
            ("p50", "bench_fio_randread_latency_p50_us"),
            ("p99", "bench_fio_randread_latency_p99_us"),
            ("p99_9", "bench_fio_randread_latency_p99_9_us"),
        ):
            if read["clat_us"][stat] is not None:  # gtod_reduce=1 measures no latency: none, not zero
                measurements.append(
                    {
                        "metric_name": name,
                        "device": device_label,
                        "labels": labels,
                        "value": read["clat_us"][stat],
                        "unit": "us",
                        "repetition": repetition,
                    }
                )
        runs.append({"repetition": repetition, "fio_version": parsed["fio_version"], "read": read})
    bench, rows, stability = bench_result("storage", measurements, fingerprint, max_rsd_percent)
    return bench, rows, stability, {"runs": runs, "argv": argv}


def run_sustained(
    ctx,
    filename,
    size,
    runtime,
    iodepth,
    block_size,
    direct,
    ioengine,
    log_dir,
    fingerprint,
    device_label,
    jump_factor,
):
    prefix = os.path.join(log_dir, "stethoscope_sustained")
    argv = [
        "fio",
        "--name=sustained",
        "--filename=%s" % filename,
        "--rw=randwrite",
        "--bs=%s" % block_size,
        "--iodepth=%d" % iodepth,
        "--ioengine=%s" % ioengine,
        "--direct=%d" % int(direct),
        "--size=%s" % size,
        "--runtime=%d" % runtime,
        "--time_based",
        "--write_lat_log=%s" % prefix,
        "--log_avg_msec=1000",
        "--output-format=json",
    ]
    parsed, out = run_and_parse(ctx, argv, parse_fio_json, "fio")
    if parsed["rc"] != 0:
        raise CollectorError("fio: exit code %s" % parsed["rc"], argv, parsed["rc"], out, "")
    log_path = prefix + "_clat.1.log"
    try:
        with open(log_path, encoding="utf-8") as handle:
            points = parse_lat_log(handle.read())
    except OSError as exc:
        raise CollectorError("fio latency log %s: %s" % (log_path, exc), argv) from None
    jump = latency_jump(points, jump_factor)
    measurements = []
    rows = []
    if jump:
        rows.append(
            metric(
                "bench_fio_latency_jump_seconds",
                device_label,
                jump["at_seconds"],
                {"mode": "sustained", "bs": block_size},
            )
        )
        measurements.append(
            {
                "metric_name": "bench_fio_latency_jump_seconds",
                "device": device_label,
                "labels": {"mode": "sustained", "bs": block_size},
                "value": jump["at_seconds"],
                "unit": "s",
                "repetition": 1,
            }
        )
    bench, _rows, stability = bench_result("storage", measurements, fingerprint)
    return bench, rows, stability, {"sustained": {"points": len(points), "jump": jump, "log": log_path}}
