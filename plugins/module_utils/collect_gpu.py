# Copyright: stethoscope developers
# Apache License 2.0
"""GPU health: `nvidia-smi -q -x`, `nvidia-smi dmon` and XID events from the kernel log."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    result,
    run_checked,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.kernel_log import (
    normalize_bdf,
    parse_xid_events,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import (
    dmon_metrics,
    gpu_metrics,
    parse_dmon,
    parse_query_xml,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

NAME = "gpu"
NO_DEVICE_MARKERS = ("No devices were found", "couldn't communicate with the NVIDIA driver")


def collect(ctx, dmon_samples=1, read_kernel_log=True):
    if not ctx.which("nvidia-smi"):
        return result(False, {"reason": "nvidia-smi not found"})
    argv = ["nvidia-smi", "-q", "-x"]
    rc, out, err = ctx.run(argv)
    if rc != 0 and any(marker in (out + err) for marker in NO_DEVICE_MARKERS):
        return result(False, {"reason": (out + err).strip().splitlines()[0]})
    if rc != 0:
        run_checked(ctx, argv, "nvidia-smi -q -x")
    try:
        query = parse_query_xml(out)
    except ParseError as exc:
        raise CollectorError(str(exc), argv, rc, out, err) from None
    gpus = query["gpus"]
    if not gpus:
        return result(False, {"reason": "nvidia-smi lists no GPU", "driver_version": query["driver_version"]})
    warnings = []
    metrics = gpu_metrics(gpus)
    metrics += _dmon(ctx, dmon_samples, warnings)
    xid = _xid(ctx, gpus, warnings) if read_kernel_log else {"source": "disabled", "events": []}
    metrics += xid.pop("metrics", [])
    facts = {
        "driver_version": query["driver_version"],
        "cuda_version": query["cuda_version"],
        "gpus": gpus,
        "xid": xid,
        "xid_preexisting": xid.pop("preexisting", {}),
    }
    return result(True, facts, metrics, warnings)


def _dmon(ctx, samples, warnings):
    argv = ["nvidia-smi", "dmon", "-c", str(samples), "-s", "pucvmet"]
    rc, out, err = ctx.run(argv)
    if rc != 0:
        warnings.append(
            "nvidia-smi dmon: exit code %s: %s; PCIe rx/tx and violation metrics skipped"
            % (rc, (err or out).strip()[:200])
        )
        return []
    try:
        return dmon_metrics(parse_dmon(out))
    except ParseError as exc:
        raise CollectorError(str(exc), argv, rc, out, err) from None


def _xid(ctx, gpus, warnings):
    """Cumulative XID counts per (GPU, code), with a cursor (boot id + position) in the state file.

    The first read on a node (no cursor yet) puts the cursor at the end of the log: what is already
    there is pre-existing, reported as such (facts and gpu_xid_preexisting_total) and counted from 0,
    so installing stethoscope on a node with old XIDs is not a burst of new events.
    """
    boot_id = ctx.read("/proc/sys/kernel/random/boot_id") or "unknown"
    state = ctx.load_state("gpu_xid")
    first_read = "cursor" not in state
    counts = dict(state.get("counts", {}))
    same_boot = state.get("boot_id") == boot_id
    cursor = state.get("cursor", {}) if same_boot else {}
    source, out = _kernel_log(ctx, warnings)
    if out is None:
        return {"source": source, "readable": False, "events": [], "metrics": _xid_rows(counts)}
    events = parse_xid_events(out)
    by_bus = {normalize_bdf(gpu["bus_id"]): gpu["device"] for gpu in gpus if gpu.get("bus_id")}
    last_seen = cursor.get("monotonic", -1.0)
    seen_untimed = cursor.get("untimed", 0)
    new_events, untimed, preexisting = [], 0, {}
    for event in events:
        if event["monotonic"] is None:
            untimed += 1
            if untimed <= seen_untimed:
                continue
        elif event["monotonic"] <= last_seen:
            continue
        device = by_bus.get(event["bdf"], "pci:" + event["bdf"])
        key = "%s|%d" % (device, event["xid"])
        if first_read:
            preexisting[key] = preexisting.get(key, 0) + 1
            counts.setdefault(key, 0)
            continue
        counts[key] = counts.get(key, 0) + 1
        new_events.append(dict(event, device=device))
    timed = [e["monotonic"] for e in events if e["monotonic"] is not None]
    ctx.save_state(
        "gpu_xid",
        {
            "boot_id": boot_id,
            "cursor": {"monotonic": max([*timed, last_seen]), "untimed": max(untimed, seen_untimed)},
            "counts": counts,
        },
    )
    rows = _xid_rows(counts)
    reported = {}
    for key, count in sorted(preexisting.items()):
        device, xid = key.rsplit("|", 1)
        reported.setdefault(device, {})[xid] = count
        rows.append(metric("gpu_xid_preexisting_total", device, count, {"xid": xid}))
    return {
        "source": source,
        "readable": True,
        "boot_id": boot_id,
        "events": new_events,
        "metrics": rows,
        "preexisting": reported,
    }


def _kernel_log(ctx, warnings):
    """(source, text): dmesg, else the journal's kernel messages with the same monotonic stamps."""
    rc, out, err = ctx.run(["dmesg"])
    if rc == 0:
        return "dmesg", out
    problem = "dmesg: exit code %s (%s)" % (rc, (err or out).strip()[:200])
    if ctx.which("journalctl"):
        rc, out, err = ctx.run(["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"])
        if rc == 0:
            return "journalctl", out
        problem += "; journalctl -k: exit code %s (%s)" % (rc, (err or out).strip()[:200])
    warnings.append(problem + ": XID events not read this sweep; root may be needed")
    return "dmesg", None


def _xid_rows(counts):
    rows = []
    for key, count in sorted(counts.items()):
        device, xid = key.rsplit("|", 1)
        rows.append(metric("gpu_xid_errors_total", device, count, {"xid": xid}))
    return rows
