# Copyright: stethoscope developers
# Apache License 2.0
"""Storage suite: fio 4k random read (iodepth 64, libaio, direct), repeated; and a sustained write
whose latency log shows when the drive falls off its cliff."""

from __future__ import annotations

import os
import stat
from collections import namedtuple

from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_runner import run_and_parse
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fio_json import parse_fio_json
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fio_latency_log import (
    latency_jump,
    parse_lat_log,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric

FioJob = namedtuple("FioJob", "filename size runtime iodepth block_size direct ioengine")
LATENCY_METRICS = (
    ("p50", "bench_fio_randread_latency_p50_us"),
    ("p99", "bench_fio_randread_latency_p99_us"),
    ("p99_9", "bench_fio_randread_latency_p99_9_us"),
)


def is_block_device(path):
    """Whether path is, or leads through symlinks to, a block device (a name says nothing:
    /scratch/raw may link to /dev/nvme1n1). A path that does not exist yet is none."""
    try:
        return stat.S_ISBLK(os.stat(os.path.realpath(path)).st_mode)
    except OSError:
        return False


def fio_argv(job, name, rw, *extra):
    return [
        "fio",
        "--name=%s" % name,
        "--filename=%s" % job.filename,
        "--rw=%s" % rw,
        "--bs=%s" % job.block_size,
        "--iodepth=%d" % job.iodepth,
        "--ioengine=%s" % job.ioengine,
        "--direct=%d" % int(job.direct),
        "--size=%s" % job.size,
        "--runtime=%d" % job.runtime,
        "--time_based",
        *extra,
        "--output-format=json",
    ]


def _run_fio(ctx, argv):
    parsed, out = run_and_parse(ctx, argv, parse_fio_json, "fio")
    error = parsed["jobs"][0].get("error") if parsed["jobs"] else "no job"
    if parsed["rc"] != 0 or error:
        raise CollectorError(
            "fio: exit code %s, job error %s" % (parsed["rc"], error), argv, parsed["rc"], out, ""
        )
    return parsed, out


def run_randread(ctx, job, repetitions, fingerprint, max_rsd_percent, device_label):
    measurements, runs = [], []
    argv = fio_argv(job, "randread", "randread", "--numjobs=1", "--group_reporting")
    labels = {"bs": job.block_size, "iodepth": str(job.iodepth)}
    for repetition in range(1, repetitions + 1):
        parsed, out = _run_fio(ctx, argv)
        read = parsed["jobs"][0].get("read")
        if not read:
            raise CollectorError("fio: the randread job read nothing", argv, parsed["rc"], out, "")
        values = [("bench_fio_randread_iops", read["iops"], "iops")]
        # gtod_reduce=1 measures no latency: none then, not zero
        values += [
            (name, read["clat_us"][stat], "us")
            for stat, name in LATENCY_METRICS
            if read["clat_us"][stat] is not None
        ]
        measurements += [
            {
                "metric_name": name,
                "device": device_label,
                "labels": labels,
                "value": value,
                "unit": unit,
                "repetition": repetition,
            }
            for name, value, unit in values
        ]
        runs.append({"repetition": repetition, "fio_version": parsed["fio_version"], "read": read})
    bench, rows, stability = bench_result("storage", measurements, fingerprint, max_rsd_percent)
    return bench, rows, stability, {"runs": runs, "argv": argv}


def run_sustained(ctx, job, log_dir, fingerprint, device_label, jump_factor):
    prefix = os.path.join(log_dir, "stethoscope_sustained")
    argv = fio_argv(job, "sustained", "randwrite", "--write_lat_log=%s" % prefix, "--log_avg_msec=1000")
    _run_fio(ctx, argv)
    log_path = prefix + "_clat.1.log"
    try:
        with open(log_path, encoding="utf-8") as handle:
            points = parse_lat_log(handle.read())
    except OSError as exc:
        raise CollectorError("fio latency log %s: %s" % (log_path, exc), argv) from None
    jump = latency_jump(points, jump_factor)
    labels = {
        "mode": "sustained",
        "bs": job.block_size,
        "iodepth": str(job.iodepth),
        "runtime": str(job.runtime),
    }
    values = cliff_values(jump, job.runtime)
    measurements = [
        {
            "metric_name": name,
            "device": device_label,
            "labels": labels,
            "value": value,
            "unit": unit,
            "repetition": 1,
        }
        for name, value, unit in values
    ]
    bench, _median_rows, stability = bench_result("storage", measurements, fingerprint)
    rows = [metric(name, device_label, value, labels) for name, value, _unit in values]  # one run: no median
    return bench, rows, stability, {"sustained": {"points": len(points), "jump": jump, "log": log_path}}


def cliff_values(jump, runtime):
    """The cliff metric of one sustained run, always: the seconds to the jump, or, with none within
    the run, the run's length (the cliff is no earlier than that), and whether it jumped at all."""
    if jump:
        return [
            ("bench_fio_latency_jump_seconds", jump["at_seconds"], "s"),
            ("bench_fio_latency_jumped", 1, "flag"),
        ]
    return [("bench_fio_latency_jump_seconds", runtime, "s"), ("bench_fio_latency_jumped", 0, "flag")]
