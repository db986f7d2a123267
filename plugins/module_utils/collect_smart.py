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
    device_name,
    parse_scan_raid,
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
    if not words:
        raise CollectorError("smart_facts devices: an empty entry", tool="smartctl")
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


def refused_devices(devices):
    """The `devices` entries smartctl_argv refuses, with why: a configuration error, said before any
    disk is read (never a collector failure that would read as a disk problem)."""
    refused = []
    for device in devices:
        try:
            smartctl_argv(device)
        except CollectorError as exc:
            refused.append(exc.msg)
    return refused


def collect(ctx, devices=None):
    if not ctx.which("smartctl"):
        return result(False, {"reason": "smartctl not found"})
    warnings = []
    names = list(devices) if devices else block_devices(ctx) + _raid_disks(ctx, warnings)
    if not names:
        return result(False, {"reason": "no disks under %s" % ctx.path("/sys/block")}, warnings=warnings)
    disks, rows, failures = {}, [], []
    for entry in names:
        argv = smartctl_argv(entry)
        name = device_name(argv[-1], argv[-2] if "-d" in argv else "")
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


def _raid_disks(ctx, warnings):
    """The physical disks behind a RAID controller, which /sys/block does not list (it shows the
    controller's virtual disks): `smartctl --scan`'s megaraid entries. A scan that fails is said, and
    the disks of /sys/block are still read."""
    argv = ["smartctl", "--scan"]
    rc, out, err = ctx.run(argv)
    if rc != 0:
        warnings.append(
            "smartctl --scan: exit code %s: %s; disks behind a RAID controller not read"
            % (rc, (err or out).strip()[:200])
        )
        return []
    entries, refused = parse_scan_raid(out)
    warnings.extend("%s; that line left out" % exc for exc in refused)
    return entries


def _read_disk(ctx, name, argv, rc, out, err):
    """The parsed disk, or a CollectorError for this disk: timed out, unparseable, or not openable
    (a disk the kernel lists that smartctl cannot open: `disk_unreadable` when its words say so)."""

    def failure(message, cause=collector_failure.TOOL_FAILED, said=out):
        return CollectorError(message, argv, rc, said, err, cause=cause, device=name)

    if rc == 124:
        raise failure("%s: timed out after %ss" % (" ".join(argv), ctx.timeout))
    try:
        disk = parse_smartctl_json(out)
    except ParseError as exc:
        raise failure("%s (%s)" % (exc, argv[-1])) from None
    disk["device"] = disk["device"] or name
    if rc & EXIT_CANNOT_READ:
        said = "; ".join(disk["messages"]) or (err or "").strip()
        message = "%s: exit status %d, device not readable: %s" % (" ".join(argv), rc, said)
        cause = collector_failure.classify("smartctl", rc, said, had_hardware=True)
        if cause == collector_failure.DISK_UNREADABLE:
            raise failure(message, cause, said)
        # not a disk that stopped answering: a RAID volume ("try adding '-d megaraid,N'"), a virtual
        # or USB disk without SMART; said, as before, and never a finding
        disk["unreadable"] = message
    return disk
