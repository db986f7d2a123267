# Copyright: stethoscope developers
# Apache License 2.0
"""The knobs env_lock locks and restores. Each plans changes (path or command, before, after) from
what the node shows now; nothing here writes until `apply` is called."""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import tempfile

from ansible_collections.aicluster.stethoscope.plugins.module_utils import grub_default, sysfs_devices
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.infiniband import parse_ibv_devinfo
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvme_feature import parse_get_feature
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

CPU = "/sys/devices/system/cpu"
GRUB_DEFAULT = "/etc/default/grub"
GRUB_D = "/etc/default/grub.d"
CSTATE_ARGS = ("intel_idle.max_cstate=1", "processor.max_cstate=1")
VWC = "0x06"  # Volatile Write Cache; 0x08 is interrupt coalescing


def change(knob, target, before, after, how="file"):
    return {"knob": knob, "target": target, "before": before, "after": after, "how": how}


def skipped(knob, reason):
    return {"knob": knob, "skipped": reason}


# planning ---------------------------------------------------------------------------------------
def plan_governor(ctx, governor="performance"):
    cpus = [c for c in ctx.listdir(CPU) if re.match(r"cpu\d+$", c)]
    paths = ["%s/%s/cpufreq/scaling_governor" % (CPU, c) for c in cpus]
    present = [(p, ctx.read(p)) for p in paths if ctx.read(p) is not None]
    if not present:
        return [skipped("governor", "no cpufreq under %s (a VM, or no frequency driver)" % ctx.path(CPU))]
    return [change("governor", p, v, governor) for p, v in present if v != governor]


def plan_cstates(ctx, keep_states=1):
    driver = ctx.read(CPU + "/cpuidle/current_driver")
    plans, found = [], False
    for cpu in (c for c in ctx.listdir(CPU) if re.match(r"cpu\d+$", c)):
        for state in ctx.listdir("%s/%s/cpuidle" % (CPU, cpu)):
            match = re.match(r"state(\d+)$", state)
            if not match:
                continue
            found = True
            path = "%s/%s/cpuidle/%s/disable" % (CPU, cpu, state)
            current = ctx.read(path)
            if int(match.group(1)) > keep_states and current != "1":
                plans.append(change("cstates", path, current, "1"))
    if not found:
        return [skipped("cstates", "no cpuidle states (driver %s)" % (driver or "absent"))]
    return plans


def plan_numa(ctx):
    current = ctx.read("/proc/sys/kernel/numa_balancing")
    if current is None:
        return [skipped("numa_balancing", "kernel has no NUMA balancing (single node or not built in)")]
    return (
        [] if current == "0" else [change("numa_balancing", "/proc/sys/kernel/numa_balancing", current, "0")]
    )


def plan_mtu(ctx, mtus):
    plans = []
    for interface, mtu in sorted(mtus.items()):
        current = ctx.read("/sys/class/net/%s/mtu" % interface)
        if current is None:
            plans.append(skipped("mtu:" + interface, "no interface %s" % interface))
        elif current != str(mtu):
            plans.append(change("mtu:" + interface, interface, current, str(mtu), how="ip"))
    return plans


def plan_write_cache(ctx):
    controllers = sysfs_devices.nvme_controllers(ctx.root)
    if not controllers:
        return []
    if not ctx.which("nvme"):
        return [skipped("nvme_write_cache", "nvme-cli not found")]
    plans = []
    for controller in controllers:
        argv = ["nvme", "get-feature", "/dev/%s" % controller, "--feature-id=%s" % VWC]
        rc, out, err = ctx.run(argv)
        if rc != 0:
            plans.append(
                skipped(
                    "nvme_write_cache:" + controller,
                    "no volatile write cache (feature 0x06 rejected: %s)" % (err or out).strip()[:120],
                )
            )
            continue
        try:
            current = parse_get_feature(out) & 0x1
        except ParseError as exc:
            raise CollectorError(str(exc), argv, rc, out, err) from None
        if current:
            plans.append(change("nvme_write_cache:" + controller, controller, "1", "0", how="nvme"))
    return plans


def plan_grub(ctx):
    """The kernel command line edit, in the file and variable grub_default's layout rule picks; the
    item keeps the edit record restore needs to give back the file's original bytes."""
    sources = grub_sources(ctx)
    if not sources:
        return [skipped("grub", "no %s (not a GRUB system)" % ctx.path(GRUB_DEFAULT))]
    planned = _grub(ctx, grub_default.add_args_to_files, sources, CSTATE_ARGS)
    if planned is None:
        return []
    path, _text, record = planned
    item = change("grub", path, record["before"], record["after"], how="grub")
    item.update(variable=record["variable"], added=record["added"], edit=record)  # restore removes only these
    return [item]


def grub_sources(ctx):
    """[(path, exact text)] of /etc/default/grub and the grub.d/*.cfg files sourced after it (Debian's
    grub-mkconfig, Azure Linux's file itself; Ubuntu cloud images set the command line there); [] if
    there is no /etc/default/grub."""
    main = read_text(ctx, GRUB_DEFAULT)
    if main is None:
        return []
    snippets = ["%s/%s" % (GRUB_D, name) for name in ctx.listdir(GRUB_D) if name.endswith(".cfg")]
    return [(GRUB_DEFAULT, main)] + [(path, read_text(ctx, path) or "") for path in snippets]


def grub_cmdline(ctx, item):
    """What the files now give the variable `item` edited ("" once it is no longer assigned)."""
    sources = grub_sources(ctx)
    if not sources:
        return None
    found = _grub(ctx, grub_default.values_in_files, sources)
    return grub_default.value_of(found, item.get("variable", grub_default.LINUX_DEFAULT))


def _grub(ctx, function, *args, **kwargs):
    """A grub_default function; what it cannot edit safely fails the module, naming file and line."""
    try:
        return function(*args, **kwargs)
    except grub_default.GrubDefaultError as exc:
        exc.tool = ctx.path(exc.tool)  # the file as on this machine (under the root prefix)
        raise CollectorError("%s: not edited, nothing changed" % exc) from None


def read_text(ctx, path):
    """The file's exact content (ctx.read strips it), or None if it does not exist."""
    try:
        with open(ctx.path(path), "rb") as handle:
            return grub_default.decode(handle.read())
    except OSError:
        return None


BOOTLOADERS = ("auto", "grubby", "update-grub", "grub2-mkconfig", "none")


def bootloader_tool(ctx, choice):
    """Which tool regenerates the boot entries. `auto`: on a node root (/), grubby on BLS systems
    (RHEL, Rocky: /boot/loader/entries), else update-grub (Debian, Ubuntu), else grub2-mkconfig;
    under a root prefix (the lab, tests) none: the file there is the whole state."""
    if choice != "auto":
        return None if choice == "none" else choice
    if ctx.root != "/":
        return None
    if ctx.which("grubby") and ctx.exists("/boot/loader/entries"):
        return "grubby"
    for tool in ("update-grub", "grub2-mkconfig"):
        if ctx.which(tool):
            return tool
    raise CollectorError(
        "no update-grub, grub2-mkconfig or grubby: %s edited, bootloader not regenerated" % GRUB_DEFAULT
    )


def bootloader_argv(tool, added, restoring):
    """The exact command: grubby edits every BLS entry itself (adding, or on restore removing, exactly
    the arguments lock added); the GRUB tools regenerate grub.cfg from /etc/default/grub."""
    if tool == "grubby":
        flag = "--remove-args" if restoring else "--args"
        return ["grubby", "--update-kernel=ALL", "%s=%s" % (flag, " ".join(added))]
    if tool == "update-grub":
        return ["update-grub"]
    return ["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"]


def ib_mtu_mismatch(ctx, mtus):
    """IPoIB interfaces set to an MTU that an InfiniBand port's active MTU does not carry (the seed's
    server 4096 / switch 2048 case: NCCL at 40 %). A finding-ready fact, not a change. IPoIB's MTU is
    the IB MTU less its 4-byte header (4092 on a 4096 port)."""
    if not ctx.which("ibv_devinfo"):
        return []
    rc, out, err = ctx.run(["ibv_devinfo"])
    if rc != 0:
        return []
    try:
        ports = parse_ibv_devinfo(out)
    except ParseError as exc:
        raise CollectorError(str(exc), ["ibv_devinfo"], rc, out, err) from None
    mismatches = []
    for interface, mtu in sorted(mtus.items()):
        if not interface.startswith("ib"):
            continue
        for (hca, port), info in sorted(ports.items()):
            active = info.get("active_mtu")
            if info.get("link_layer") == "InfiniBand" and isinstance(active, int) and active < int(mtu) - 4:
                mismatches.append(
                    {
                        "interface": interface,
                        "mtu": int(mtu),
                        "port": "%s/%s" % (hca, port),
                        "ib_active_mtu": active,
                    }
                )
    return mismatches


# applying ---------------------------------------------------------------------------------------
def write_file(ctx, path, value):
    with open(ctx.path(path), "w", encoding="utf-8") as handle:
        handle.write(str(value) + "\n")


def apply(ctx, item, value_key="after"):
    value = item[value_key]
    if item["how"] == "file":
        write_file(ctx, item["target"], value)
    elif item["how"] == "ip":
        if ctx.root == "/":
            _checked(ctx, ["ip", "link", "set", "dev", item["target"], "mtu", str(value)])
        else:  # a node root prefix (the lab, tests): the sysfs attribute the kernel would update
            write_file(ctx, "/sys/class/net/%s/mtu" % item["target"], value)
    elif item["how"] == "nvme":
        device = "/dev/%s" % item["target"]
        _checked(ctx, ["nvme", "set-feature", device, "--feature-id=%s" % VWC, "--value=%s" % value])
        rc, out, _err = ctx.run(["nvme", "get-feature", device, "--feature-id=%s" % VWC])
        if rc != 0 or str(parse_get_feature(out) & 0x1) != str(value):
            raise CollectorError(
                "nvme %s: volatile write cache still %s after set-feature" % (device, out.strip())
            )
    elif item["how"] == "grub":
        _set_grub_cmdline(ctx, item, restoring=item.get("restoring", False))


def _checked(ctx, argv):
    rc, out, err = ctx.run(argv)
    if rc != 0:
        raise CollectorError(
            "%s: exit code %s: %s" % (" ".join(argv[:3]), rc, (err or out).strip()[:200]), argv, rc, out, err
        )


def _set_grub_cmdline(ctx, item, restoring):
    """Lock: the planned edit. Restore: its inverse, byte-exact where the edited value still stands;
    an item recorded before edit records existed removes its added arguments from _DEFAULT."""
    added = item.get("added") or list(CSTATE_ARGS)
    if restoring:
        record = item.get("edit") or {"variable": grub_default.LINUX_DEFAULT, "added": added}
        path = record.get("file", GRUB_DEFAULT)
        text = read_text(ctx, path) or ""
        new_text = _grub(ctx, grub_default.remove_args, text, record, path=path)
    else:
        path, text = item["target"], None
        planned = _grub(ctx, grub_default.add_args_to_files, grub_sources(ctx), added)
        new_text = planned[1] if planned is not None and planned[0] == path else None
    if new_text is None or new_text == text:
        raise CollectorError(
            "%s: %s %s in %s as planned; nothing changed"
            % (
                ctx.path(path),
                " ".join(added),
                "not found" if restoring else "no longer missing",
                item.get("variable", grub_default.LINUX_DEFAULT),
            )
        )
    _replace_file(ctx.path(path), grub_default.encode(new_text))
    tool = item.get("bootloader")
    if tool:
        _checked(ctx, bootloader_argv(tool, added, restoring))


def _replace_file(target, data):
    """Write `data` to a file beside `target` (its mode and owner), flush it to disk and rename it over
    `target`: a crash or a full disk leaves the old file or the new one, never a cut one that the next
    kernel update would turn into boot entries without their arguments."""
    info = os.stat(target)
    fd, temporary = tempfile.mkstemp(prefix=".stethoscope-", dir=os.path.dirname(target))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, stat.S_IMODE(info.st_mode))
        if os.geteuid() == 0:
            os.chown(temporary, info.st_uid, info.st_gid)
        os.replace(temporary, target)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


# /dev/cpu_dma_latency ---------------------------------------------------------------------------
HOLDER = (
    "import os, signal, struct, sys\n"
    "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
    "os.write(fd, struct.pack('i', 0))\n"
    "signal.signal(signal.SIGTERM, lambda *_: os._exit(0))\n"
    "while True:\n    signal.pause()\n"
)


def holder_alive(pid):
    if not pid:
        return False
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"stethoscope-cpu-dma-latency" in handle.read()
    except OSError:
        return False


def start_holder(ctx, python):
    """A detached process keeping /dev/cpu_dma_latency open at 0 µs, as tuned's latency-performance
    does: the kernel honours the request only while the file stays open."""
    path = ctx.path("/dev/cpu_dma_latency")
    if not os.path.exists(path):
        raise CollectorError("%s does not exist: no PM QoS interface on this kernel" % path)
    process = subprocess.Popen(
        [python, "-c", HOLDER, path, "stethoscope-cpu-dma-latency"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    return process.pid


def stop_holder(pid):
    if holder_alive(pid):
        os.kill(pid, signal.SIGTERM)
