# Copyright: stethoscope developers
# Apache License 2.0
"""SMART and NVMe health of every disk through `smartctl -j -a`."""

from __future__ import annotations

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


def collect(ctx, devices=None):
    if not ctx.which("smartctl"):
        return result(False, {"reason": "smartctl not found"})
    names = list(devices) if devices else block_devices(ctx)
    if not names:
        return result(False, {"reason": "no disks under %s" % ctx.path("/sys/block")})
    disks, rows, warnings = {}, [], []
    for name in names:
        argv = ["smartctl", "-j", "-a", "/dev/%s" % name]
        rc, out, err = ctx.run(argv)
        if rc == 124:
            raise CollectorError(
                "smartctl -j -a /dev/%s: timed out after %ss" % (name, ctx.timeout), argv, rc, out, err
            )
        try:
            disk = parse_smartctl_json(out)
        except ParseError as exc:
            raise CollectorError(str(exc) + " (/dev/%s)" % name, argv, rc, out, err) from None
        disk["device"] = disk["device"] or name
        disks[name] = disk
        if rc & EXIT_CANNOT_READ:
            warnings.append(
                "smartctl /dev/%s: exit status %d, device not readable: %s"
                % (name, rc, "; ".join(disk["messages"]) or (err or "").strip())
            )
            continue
        rows += smart_metrics(disk)
    return result(True, {"disks": disks}, rows, warnings)
