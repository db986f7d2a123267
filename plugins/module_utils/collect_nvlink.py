# Copyright: stethoscope developers
# Apache License 2.0
"""NVLink state and error counters; the error rate comes from deltas between sweeps."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    result,
    run_checked,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add, metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvlink import (
    parse_errors,
    parse_status,
    parse_throughput,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

NAME = "nvlink"
COUNTER_METRICS = {
    "crc": "nvlink_crc_errors_total",
    "replay": "nvlink_replay_errors_total",
    "recovery": "nvlink_recovery_errors_total",
}


def _parsed(ctx, argv, parser, required=True):
    if required:
        out = run_checked(ctx, argv, " ".join(argv))
    else:
        rc, out, _err = ctx.run(argv)
        if rc != 0:
            return None
    try:
        return parser(out)
    except ParseError as exc:
        raise CollectorError(str(exc), argv, 0, out, "") from None


def collect(ctx):
    if not ctx.which("nvidia-smi"):
        return result(False, {"reason": "nvidia-smi not found"})
    status = _parsed(ctx, ["nvidia-smi", "nvlink", "-s"], parse_status)
    if not status:
        return result(False, {"reason": "no GPU reports NVLink (nvidia-smi nvlink -s printed nothing)"})
    errors = _parsed(ctx, ["nvidia-smi", "nvlink", "-e"], parse_errors) or {}
    throughput = _parsed(ctx, ["nvidia-smi", "nvlink", "-gt", "d"], parse_throughput, required=False)
    previous = ctx.load_state("nvlink")
    now = ctx.now()
    rows, snapshot, warnings = [], {}, []
    for gpu_index, gpu in sorted(status.items()):
        if gpu["all_inactive"] and not gpu["links"]:
            rows.append(metric("nvlink_link_up", "gpu%d/links" % gpu_index, 0, {"scope": "all"}))
            continue
        for link, link_state in sorted(gpu["links"].items()):
            device = "gpu%d/link%d" % (gpu_index, link)
            rows.append(metric("nvlink_link_up", device, link_state["up"]))
            counters = errors.get(gpu_index, {}).get(link, {})
            for key, name in COUNTER_METRICS.items():
                add(rows, name, device, counters.get(key))
            total_errors = sum(counters.get(key, 0) for key in COUNTER_METRICS) if counters else None
            data_kib = (throughput or {}).get(gpu_index, {}).get(link, {}).get("data_kib")
            snapshot[device] = {"errors": total_errors, "data_kib": data_kib}
            before = previous.get("links", {}).get(device)
            if before and None not in (total_errors, data_kib, before.get("errors"), before.get("data_kib")):
                d_err, d_data = total_errors - before["errors"], data_kib - before["data_kib"]
                if d_err >= 0 and d_data > 0:
                    add(rows, "nvlink_error_rate_percent", device, d_err / d_data * 100.0)
    if throughput is None:
        warnings.append(
            "nvidia-smi nvlink -gt d not available: nvlink_error_rate_percent skipped, counters only"
        )
    ctx.save_state("nvlink", {"at": now, "links": snapshot})
    return result(True, {"gpus": {str(k): v for k, v in status.items()}, "errors": errors}, rows, warnings)
