# Copyright: stethoscope developers
# Apache License 2.0
"""A broken instrument is a finding: what a collector's failure means, and the rows that record it.

A tool that cannot answer on hardware it answered for before is often the symptom itself: nvidia-smi
cannot reach a GPU that fell off the bus, ibv_devinfo finds no HCA where sysfs lists one, smartctl
cannot open a disk the kernel still lists. `classify` names the cause from the tool's own words
(real messages, tests/fixtures/public); everything else is `tool_failed` (the instrument is broken).
"""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import metric

GPU_LOST = "gpu_lost"
HCA_MISSING = "hca_missing"
DISK_UNREADABLE = "disk_unreadable"
TOOL_FAILED = "tool_failed"
FAILED_METRIC = "collector_failed"
EXIT_CODE_METRIC = "collector_exit_code"
# the gauge of each cause that means hardware (named in full: the catalog test reads literal names)
CAUSE_METRICS = {
    GPU_LOST: "collector_gpu_lost",
    HCA_MISSING: "collector_hca_missing",
    DISK_UNREADABLE: "collector_disk_unreadable",
}
FIRST_LINE_CAP = 200

# (tool, words in its output, cause, only where the node had such hardware before). Checked in order.
HARDWARE_SIGNS = (
    # nvidia-smi when NVML cannot get a handle: "Unknown Error" (Xid 79 era) or "GPU is lost"
    ("nvidia-smi", "Unable to determine the device handle", GPU_LOST, False),
    ("nvidia-smi", "GPU is lost", GPU_LOST, False),
    ("nvidia-smi", "No devices were found", GPU_LOST, True),
    ("ibv_devinfo", "No IB devices found", HCA_MISSING, True),
    # ibstat listed an IB device it then could not read (not "can't list IB device names": no HCA)
    ("ibstat", "stat of IB device", HCA_MISSING, False),
    ("smartctl", "failed: No such device", DISK_UNREADABLE, True),  # also "... or address"
    ("smartctl", "Input/output error", DISK_UNREADABLE, True),
)
# exit codes that mean hardware on their own: nvidia-smi's 15, "GPU has fallen off the bus or has
# otherwise become inaccessible" (nvidia-smi(1)). Its 255 ("other error or internal driver error")
# is NVML's catch-all, also after a container's cgroup lost the device: a lost GPU only by its words.
HARDWARE_EXIT_CODES = {"nvidia-smi": (15, GPU_LOST)}
# tools that print nothing at all when the hardware they list has gone
SILENT_WHEN_GONE = {"ibstat": HCA_MISSING, "ibv_devinfo": HCA_MISSING}


def first_line(*texts):
    """The first non-blank line of the first text that has one, capped: what a person reads first."""
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()[:FIRST_LINE_CAP]
    return ""


def classify(tool, rc, output, had_hardware=False):
    """The cause of a failure of `tool` (its name, argv[0]) that exited `rc` and printed `output`.

    had_hardware: the node had this hardware before (a previous sweep saw it, or sysfs lists it now);
    some messages ("No devices were found") mean a fault only then."""
    name = (tool or "").split()[0] if tool else ""
    text = output or ""
    for sign_tool, words, cause, needs_history in HARDWARE_SIGNS:
        if name == sign_tool and words in text and (had_hardware or not needs_history):
            return cause
    coded = HARDWARE_EXIT_CODES.get(name)
    if coded and rc == coded[0]:
        return coded[1]
    if name in SILENT_WHEN_GONE and had_hardware and rc != 124 and not text.strip():
        return SILENT_WHEN_GONE[name]
    return TOOL_FAILED


def failure(collector, tool, rc, cause, line, device=None, msg=None, cmd=None, stdout=None, stderr=None):
    """One collector failure as run_collectors records it (rows, fact, fail_json)."""
    return {
        "collector": collector,
        "tool": tool,
        "rc": rc,
        "cause": cause,
        "first_line": line,
        "device": device or collector,
        "msg": msg or "%s: exit code %s: %s" % (tool, rc, line),
        "cmd": cmd,
        "stdout": stdout,
        "stderr": stderr,
    }


def from_error(collector, exc):
    """A collector's CollectorError as a failure record (its cause classified when it gave none)."""
    tool = exc.tool or collector
    cause = exc.cause or classify(tool, exc.rc, "%s\n%s" % (exc.stderr or "", exc.stdout or ""))
    line = first_line(exc.stderr, exc.stdout) or exc.msg
    return failure(collector, tool, exc.rc, cause, line, exc.device, exc.msg, exc.cmd, exc.stdout, exc.stderr)


def failure_rows(item):
    """`collector_failed` 1 (labels collector, tool, rc, cause), the tool's exit code as a value, and
    for a cause that means hardware its own gauge (`collector_gpu_lost`, ...), of that hardware's
    layer; `cleared` turns them into the rows that close the series."""
    rc = item["rc"] if isinstance(item["rc"], int) else -1
    labels = {"collector": item["collector"], "tool": item["tool"]}
    rows = [
        metric(FAILED_METRIC, item["device"], 1, dict(labels, rc=str(rc), cause=item["cause"])),
        metric(EXIT_CODE_METRIC, item["device"], rc, dict(labels, cause=item["cause"])),
    ]
    if item["cause"] != TOOL_FAILED:
        cause_metric = CAUSE_METRICS.get(item["cause"])
        if cause_metric:
            rows.append(metric(cause_metric, item["device"], 1, dict(labels, rc=str(rc))))
    return rows


def cleared(rows):
    """The same series at 0: the collector answered again."""
    return [metric(row["name"], row["device"], 0, row["labels"]) for row in rows]


def fact(item):
    """What the facts row keeps of a failure: the text a person needs (the tool's first line)."""
    keys = ("tool", "rc", "cause", "first_line", "device", "msg", "cmd")
    return {key: item[key] for key in keys}
