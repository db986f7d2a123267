# Copyright: stethoscope developers
# Apache License 2.0
"""GPU health: `nvidia-smi -q -x`, `nvidia-smi dmon` and XID events from the kernel log."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collector_failure
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    result,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.kernel_log import (
    normalize_bdf,
    parse_gpu_lost_events,
    parse_sxid_events,
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
SEEN_STATE = "gpu_devices"  # the GPUs the last good sweep saw (bus -> device): a lost one keeps its name
# "Unable to determine the device handle for GPU0000:A1:00.0: ..." (older drivers: "GPU 0000:...")
HANDLE_BUS = re.compile(r"GPU\s?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\.[0-7]")


def collect(ctx, dmon_samples=1, read_kernel_log=True):
    if not ctx.which("nvidia-smi"):
        return result(False, {"reason": "nvidia-smi not found"})
    seen = ctx.load_state(SEEN_STATE).get("gpus", {})
    argv = ["nvidia-smi", "-q", "-x"]
    rc, out, err = ctx.run_once(argv)
    if rc != 0 and not seen and any(marker in (out + err) for marker in NO_DEVICE_MARKERS):
        return result(False, {"reason": (out + err).strip().splitlines()[0]})
    try:
        query = _query(ctx, argv, rc, out, err, seen)
    except CollectorError as exc:
        return _without_nvidia_smi(ctx, exc, seen, read_kernel_log)
    gpus = query["gpus"]
    if not gpus:
        return result(False, {"reason": "nvidia-smi lists no GPU", "driver_version": query["driver_version"]})
    _remember(ctx, gpus)
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


def _query(ctx, argv, rc, out, err, seen):
    """The parsed `nvidia-smi -q -x`, or a CollectorError saying what its failure means."""
    said = "%s\n%s" % (err, out)
    line = collector_failure.first_line(err, out)
    if rc == 124:
        raise CollectorError(
            "nvidia-smi -q -x: timed out after %ss" % ctx.timeout, argv, rc, out, err, cause="tool_failed"
        )
    if rc != 0:
        cause = collector_failure.classify("nvidia-smi", rc, said, had_hardware=bool(seen))
        raise CollectorError(
            "nvidia-smi -q -x: exit code %s: %s" % (rc, line),
            argv,
            rc,
            out,
            err,
            cause=cause,
            device=_lost_device(said, seen) if cause == collector_failure.GPU_LOST else None,
        )
    try:
        return parse_query_xml(out)
    except ParseError as exc:
        raise CollectorError(str(exc), argv, rc, out, err, cause="tool_failed") from None


def _lost_device(said, seen):
    """The GPU nvidia-smi names in its failure, as the last good sweep named it (else pci:<bus>)."""
    found = HANDLE_BUS.search(said)
    if not found:
        return None
    bus = normalize_bdf(found.group(1))
    return seen.get(bus, "pci:" + bus)


def _remember(ctx, gpus):
    buses = {normalize_bdf(gpu["bus_id"]): gpu["device"] for gpu in gpus if gpu.get("bus_id")}
    if ctx.load_state(SEEN_STATE) != {"gpus": buses}:
        ctx.save_state(SEEN_STATE, {"gpus": buses})


def _lost_named_by_log(ctx, seen, events):
    """The lost GPU nvidia-smi could not name ("No devices were found"), named by the kernel log of the
    same sweep (one GPU with an Xid 79 or fallen off the bus), or as an earlier sweep of this loss named
    it: so its finding joins that GPU's incident. None when nothing says which GPU."""
    lost = sorted({e["device"] for e in events if e.get("xid") == 79 or e.get("reason") == "fallen_off_bus"})
    state = ctx.load_state(SEEN_STATE)
    if len(lost) != 1:
        return state.get("lost")
    ctx.save_state(SEEN_STATE, {"gpus": seen, "lost": lost[0]})
    return lost[0]


def _without_nvidia_smi(ctx, exc, seen, read_kernel_log):
    """nvidia-smi failed: the kernel log is still read (a lost GPU's Xid 79 is there), with the GPUs
    named as the last good sweep saw them; the failure travels beside the rows."""
    warnings = []
    known = [{"bus_id": bus, "device": device} for bus, device in sorted(seen.items())]
    xid = _xid(ctx, known, warnings) if read_kernel_log else {"source": "disabled", "events": []}
    metrics = xid.pop("metrics", [])
    facts = {"xid": xid, "xid_preexisting": xid.pop("preexisting", {})}
    if exc.cause == collector_failure.GPU_LOST and not exc.device:
        exc.device = _lost_named_by_log(ctx, seen, xid["events"])
    return result(
        bool(seen) or None, facts, metrics, warnings, failures=[collector_failure.from_error(NAME, exc)]
    )


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
        rows = _xid_rows(counts) + _other_rows(state)
        return {"source": source, "readable": False, "events": [], "metrics": rows}
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
    other = _other_kernel_events(out, by_bus, state, cursor, first_read)
    timed = [e["monotonic"] for e in events + other["events"] if e["monotonic"] is not None]
    ctx.save_state(
        "gpu_xid",
        dict(
            other["state"],
            boot_id=boot_id,
            cursor=dict(
                other["cursor"], monotonic=max([*timed, last_seen]), untimed=max(untimed, seen_untimed)
            ),
            counts=counts,
        ),
    )
    rows = _xid_rows(counts) + other["rows"]
    new_events += other["new_events"]
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


# Kernel-log events other than XIDs: (kind, parser, state key of their counts, metric, label names).
# A lost GPU's Xid 79 line and its NVRM line are two metrics, each counted once; rules read one of them.
OTHER_EVENTS = (
    ("gpu_lost", parse_gpu_lost_events, "lost_counts", "gpu_lost_events_total", ("reason",)),
    ("sxid", parse_sxid_events, "sxid_counts", "nvswitch_sxid_errors_total", ("sxid", "severity")),
)


def _other_kernel_events(out, by_bus, state, cursor, first_read):
    """GPU-lost and NVSwitch SXid events under the XID reader's cursor (one monotonic position; each
    kind keeps its own count of untimed lines). On the first read they are pre-existing: counted from 0."""
    found = {"events": [], "new_events": [], "rows": [], "state": {}, "cursor": {}}
    for kind, parse, counts_key, _name, labels in OTHER_EVENTS:
        events = parse(out)
        counts = dict(state.get(counts_key, {}))
        untimed_key = "untimed_" + kind
        seen_untimed, untimed = cursor.get(untimed_key, 0), 0
        for event in events:
            if event["monotonic"] is None:
                untimed += 1
                if untimed <= seen_untimed:
                    continue
            elif event["monotonic"] <= cursor.get("monotonic", -1.0):
                continue
            device = event.get("switch") or by_bus.get(event["bdf"], "pci:" + event["bdf"])
            key = "|".join([device] + [str(event[label]) for label in labels])
            counts[key] = counts.get(key, 0) + (0 if first_read else 1)
            if not first_read:
                found["new_events"].append(dict(event, device=device, kind=kind))
        found["events"] += events
        found["state"][counts_key] = counts
        found["cursor"][untimed_key] = max(untimed, seen_untimed)
    found["rows"] = _other_rows(found["state"])
    return found


def _other_rows(state):
    rows = []
    for _kind, _parse, counts_key, name, labels in OTHER_EVENTS:
        for key, count in sorted(state.get(counts_key, {}).items()):
            device, *values = key.split("|")
            rows.append(metric(name, device, count, dict(zip(labels, values))))
    return rows
