# Copyright: stethoscope developers
# Apache License 2.0
"""SMART and NVMe health of every disk through `smartctl -j -a`."""

from __future__ import annotations

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collector_failure
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    result,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.smartctl import (
    EXIT_CANNOT_READ,
    parse_smartctl_json,
    smart_metrics,
)

NAME = "smart"
SKIP_PREFIXES = ("loop", "ram", "zram", "dm-", "md", "sr", "nbd", "fd")


def block_devices(ctx):
    return [name for name in ctx.listdir("/sys/block") if not name.startswith(SKIP_PREFIXES)]


def smartctl_argv(device):
    """`sda` or `/dev/sda`; a disk behind a RAID controller as `smartctl --scan` lists it:
    `/dev/bus/0 -d megaraid,3` (or `-d sat+megaraid,3` for a SATA disk there)."""
    words = device.split()
    path = words[0] if words[0].startswith("/") else "/dev/" + words[0]
    if len(words) == 1:
        return ["smartctl", "-j", "-a", path]
    if len(words) == 3 and words[1] == "-d":
        return ["smartctl", "-j", "-a", "-d", words[2], path]
    raise CollectorError(
        "smart_facts devices: %r is neither a disk name nor 'PATH -d TYPE' (/dev/bus/0 -d megaraid,3)"
        % device,
        tool="smartctl",
    )


def collect(ctx, devices=None):
    if not ctx.which("smartctl"):
        return result(False, {"reason": "smartctl not found"})
    names = list(devices) if devices else block_devices(ctx)
    if not names:
        return result(False, {"reason": "no disks under %s" % ctx.path("/sys/block")})
    disks, rows, warnings, failures = {}, [], [], []
    for name in names:
        argv = smartctl_argv(name)
        rc, out, err = ctx.run(argv)
        try:
            disk = _read_disk(ctx, name, argv, rc, out, err)
        except CollectorError as exc:  # one disk's failure is its own finding; the others are read
            failures.append(collector_failure.from_error(NAME, exc))
            continue
        if disk.get("unreadable"):
            warnings.append(disk.pop("unreadable"))
        disks[disk["device"]] = disk
        rows += smart_metrics(disk)
    return result(True, {"disks": disks}, rows, warnings, failures=failures)


def _read_disk(ctx, name, argv, rc, out, err):
    """The parsed disk, or a CollectorError for this disk: timed out, unparseable, or not openable
    (a disk the kernel lists that smartctl cannot open: `disk_unreadable` when its words say so)."""

    def failure(message, cause=collector_failure.TOOL_FAILED, said=out):
        return CollectorError(message, argv, rc, said, err, cause=cause, device=name)

    if rc == 124:
        raise failure("smartctl -j -a /dev/%s: timed out after %ss" % (name, ctx.timeout))
    try:
        disk = parse_smartctl_json(out)
    except ParseError as exc:
        raise failure(str(exc) + " (/dev/%s)" % name) from None
    disk["device"] = disk["device"] or name
    if rc & EXIT_CANNOT_READ:
        said = "; ".join(disk["messages"]) or (err or "").strip()
        message = "smartctl /dev/%s: exit status %d, device not readable: %s" % (name, rc, said)
        cause = collector_failure.classify("smartctl", rc, said, had_hardware=True)
        if cause == collector_failure.DISK_UNREADABLE:
            raise failure(message, cause, said)
        # not a disk that stopped answering: a RAID volume ("try adding '-d megaraid,N'"), a virtual
        # or USB disk without SMART; said, as before, and never a finding
        disk["unreadable"] = message
    return disk
