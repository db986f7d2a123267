# Copyright: stethoscope developers
# Apache License 2.0
"""Tuning state that makes benchmarks comparable: governor, C-states, NUMA balancing, MTU,
NVMe volatile write cache (feature 0x06) and the kernel command line."""

from __future__ import annotations

import hashlib
import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils import sysfs_devices
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
    CollectorError,
    result,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.metric_rows import add, metric
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvme_feature import parse_get_feature
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

NAME = "tuning"
CPU = "/sys/devices/system/cpu"
VWC_FEATURE = "0x06"  # Volatile Write Cache (0x08 is interrupt coalescing)


def _governors(ctx):
    cpus = [c for c in ctx.listdir(CPU) if re.match(r"cpu\d+$", c)]
    found = {}
    for cpu in cpus:
        governor = ctx.read("%s/%s/cpufreq/scaling_governor" % (CPU, cpu))
        if governor is not None:
            found[cpu] = governor
    return found


def _cstates(ctx):
    """Deepest enabled cpuidle state of cpu0, or the intel_idle.max_cstate limit where cpuidle has none."""
    driver = ctx.read(CPU + "/cpuidle/current_driver")
    states = []
    for state in ctx.listdir(CPU + "/cpu0/cpuidle"):
        if not re.match(r"state\d+$", state):
            continue
        base = "%s/cpu0/cpuidle/%s/" % (CPU, state)
        states.append(
            {
                "index": int(state[5:]),
                "name": ctx.read(base + "name"),
                "disabled": ctx.read(base + "disable") == "1",
            }
        )
    enabled = [s["index"] for s in states if not s["disabled"]]
    limit = ctx.read("/sys/module/intel_idle/parameters/max_cstate")
    facts = {
        "driver": driver,
        "states": states,
        "intel_idle_max_cstate": int(limit) if limit and limit.isdigit() else None,
    }
    if enabled:
        facts["max_cstate"] = max(enabled)
    elif facts["intel_idle_max_cstate"] is not None:
        facts["max_cstate"] = facts["intel_idle_max_cstate"]
    else:
        facts["max_cstate"] = None
    return facts


def _volatile_write_cache(ctx, warnings):
    controllers = sysfs_devices.nvme_controllers(ctx.root)
    if not controllers:
        return {}
    if not ctx.which("nvme"):
        warnings.append(
            "nvme-cli not found: volatile write cache state of %s not read" % ", ".join(controllers)
        )
        return {}
    caches = {}
    for controller in controllers:
        argv = ["nvme", "get-feature", "/dev/%s" % controller, "--feature-id=%s" % VWC_FEATURE]
        rc, out, err = ctx.run(argv)
        if rc != 0:
            # A drive without a volatile write cache rejects the feature: skipped with the reason.
            caches[controller] = {
                "enabled": None,
                "reason": (err or out).strip()[:200] or "exit code %s" % rc,
            }
            continue
        try:
            caches[controller] = {"enabled": parse_get_feature(out) & 0x1}
        except ParseError as exc:
            raise CollectorError(str(exc) + " (/dev/%s)" % controller, argv, rc, out, err) from None
    return caches


def collect(ctx):
    warnings, rows = [], []
    governors = _governors(ctx)
    if governors:
        performance = int(all(g == "performance" for g in governors.values()))
        rows.append(metric("cpu_governor_performance", "cpu", performance))
    cstates = _cstates(ctx)
    add(rows, "cpu_max_cstate", "cpu", cstates["max_cstate"])
    numa = ctx.read("/proc/sys/kernel/numa_balancing")
    numa_enabled = None if numa is None or not numa.isdigit() else int(int(numa) != 0)
    add(rows, "numa_balancing_enabled", "node", numa_enabled)
    mtus = {}
    for interface in ctx.listdir("/sys/class/net"):
        mtu = ctx.read("/sys/class/net/%s/mtu" % interface)
        if interface != "lo" and mtu and mtu.isdigit():
            mtus[interface] = int(mtu)
            rows.append(metric("net_mtu", interface, mtus[interface]))
    caches = _volatile_write_cache(ctx, warnings)
    for controller, cache in sorted(caches.items()):
        add(rows, "nvme_volatile_write_cache_enabled", controller, cache["enabled"])
    cmdline = ctx.read("/proc/cmdline")
    facts = {
        "cpu_governors": governors,
        "cpufreq": bool(governors),
        "cstates": cstates,
        "numa_balancing": numa_enabled,
        "mtu": mtus,
        "nvme_volatile_write_cache": caches,
        "kernel_cmdline": cmdline,
        "kernel_cmdline_sha256": hashlib.sha256(cmdline.encode()).hexdigest()
        if cmdline is not None
        else None,
    }
    if not governors:
        facts["cpufreq_reason"] = "no cpufreq under %s (VM or driver absent)" % ctx.path(CPU)
    return result(True, facts, rows, warnings)
