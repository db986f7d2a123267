#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: env_lock
short_description: Lock a node's environment for benchmarks, and put it back exactly as it was
version_added: "0.1.0"
description:
  - 'C(state=locked): CPU governor C(performance) (cpupower where present, else sysfs for every CPU); deep
    cpuidle states disabled at runtime (vendor-neutral) and C(/dev/cpu_dma_latency) held at 0 by a detached
    process; C(kernel.numa_balancing=0); the listed interfaces'' MTU; NVMe volatile write cache off (C(nvme
    set-feature --feature-id=0x06 --value=0), verified with get-feature, not saved across resets); with
    I(persistent_cstates), C(intel_idle.max_cstate=1 processor.max_cstate=1) on the kernel command line
    through the distribution''s tool, reporting C(reboot_required) and never rebooting.'
  - The previous value of everything it changes is recorded on the node (I(state_dir)/env_lock.json) before the
    first change; C(state=restored) writes those values back and stops the latency holder.
  - Knobs the node lacks (a VM without cpufreq) are skipped with the reason. Check mode and diff show exactly what would change. Idempotent.
  - Also reports, as a fact, interfaces whose MTU the InfiniBand port's active MTU does not carry (server 4096, switch 2048 leaves NCCL at 40 %).
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  state:
    description: Lock, or restore what a previous lock recorded.
    type: str
    choices: [locked, restored]
    default: locked
  governor:
    description: CPU frequency governor to set.
    type: str
    default: performance
  keep_cstates:
    description: cpuidle states up to this index stay enabled (state0 is polling, state1 C1).
    type: int
    default: 1
  hold_cpu_dma_latency:
    description: Keep C(/dev/cpu_dma_latency) open at 0 µs while locked.
    type: bool
    default: true
  numa_balancing:
    description: Turn automatic NUMA balancing off.
    type: bool
    default: true
  mtu:
    description: Interface name to MTU.
    type: dict
    default: {}
  nvme_write_cache_off:
    description: Turn the NVMe volatile write cache off on every controller that has one.
    type: bool
    default: true
  bootloader:
    description:
      - Which tool regenerates the boot entries after C(/etc/default/grub) changes. C(auto) picks
        C(grubby) on BLS systems (RHEL, Rocky), else C(update-grub), else C(grub2-mkconfig), and
        none under a I(root) prefix. Lock adds exactly the missing C-state arguments
        (C(grubby --update-kernel=ALL --args=...)); restore removes exactly those
        (C(grubby --update-kernel=ALL --remove-args=...)) or regenerates from the restored file.
    type: str
    choices: [auto, grubby, update-grub, grub2-mkconfig, none]
    default: auto
  persistent_cstates:
    description:
      - Also limit C-states on the kernel command line (takes effect after a reboot the module never does).
      - 'C(/etc/default/grub) is read as the shell reads it (double, single or no quotes, C($VAR) references
        kept as written, comments, the last of several assignments) and only the missing arguments are added,
        in the value''s own quoting: to C(GRUB_CMDLINE_LINUX_DEFAULT) where the file assigns it (Debian, Ubuntu,
        Arch, openSUSE, Azure Linux), else to C(GRUB_CMDLINE_LINUX) (RHEL, Rocky, Alma, CentOS, Fedora as
        Anaconda writes it), else on one appended C(GRUB_CMDLINE_LINUX_DEFAULT) line; where a
        C(/etc/default/grub.d/*.cfg) sourced after it sets that variable (Ubuntu cloud images), that file is
        the one edited. Restore gives back the file''s original bytes (where the value changed since, only
        the added arguments are removed).'
      - A file it cannot edit safely (command substitution, a line continuation, a quote closed on a later
        line, words after the value, an assignment inside a block) fails the task naming the file and the
        line, and nothing is changed.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Reports in C(changes) what would change and changes nothing, state file included.
  diff_mode:
    support: full
    description: The knobs' values before and after, as a diff.
  facts:
    support: full
    description: The lock's state (settings in force, skipped knobs) as C(ansible_facts.stethoscope_env_lock).
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Lock for benchmarks
  aicluster.stethoscope.env_lock:
    mtu: {ib0: 4092}

- name: Put everything back
  aicluster.stethoscope.env_lock:
    state: restored
"""

RETURN = r"""
changes:
  description:
    - What was (or in check mode would be) changed, each with its knob, target, before and after.
    - The C(grub) change also names the C(variable) edited, the arguments C(added) (what restore removes)
      and the C(edit) record restore uses; its before and after are that variable's value.
  returned: always
  type: list
  elements: dict
skipped_knobs:
  description: Knobs this node lacks, with the reason.
  returned: always
  type: list
  elements: dict
reboot_required:
  description: The kernel command line was changed; the C-state limit applies after the next boot.
  returned: always
  type: bool
ansible_facts:
  description: C(stethoscope_env_lock) with state, the settings in force, skipped knobs and C(ib_mtu_mismatch).
  returned: always
  type: dict
"""

import json
import os
import sys

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import env_knobs
from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    make_context,
)

STATE = "env_lock"


def plan_lock(ctx, p):
    plans = env_knobs.plan_governor(ctx, p["governor"]) + env_knobs.plan_cstates(ctx, p["keep_cstates"])
    if p["numa_balancing"]:
        plans += env_knobs.plan_numa(ctx)
    plans += env_knobs.plan_mtu(ctx, p["mtu"])
    if p["nvme_write_cache_off"]:
        plans += env_knobs.plan_write_cache(ctx)
    if p["persistent_cstates"]:
        tool = env_knobs.bootloader_tool(ctx, p["bootloader"])
        plans += [dict(item, bootloader=tool) for item in env_knobs.plan_grub(ctx)]
    return [x for x in plans if "skipped" not in x], [x for x in plans if "skipped" in x]


def diff_text(changes, key):
    return "".join("%s %s = %s\n" % (c["knob"], c["target"], c[key]) for c in changes)


def lock(module, ctx, p, state):
    changes, skipped = plan_lock(ctx, p)
    recorded = state.get("previous", {})
    holder = state.get("holder_pid")
    start_holder = p["hold_cpu_dma_latency"] and not env_knobs.holder_alive(holder)
    if start_holder and not os.path.exists(ctx.path("/dev/cpu_dma_latency")):
        skipped.append(env_knobs.skipped("cpu_dma_latency", "no %s" % ctx.path("/dev/cpu_dma_latency")))
        start_holder = False
    if start_holder:
        changes.append(
            env_knobs.change(
                "cpu_dma_latency", "/dev/cpu_dma_latency", "released", "held at 0 us", how="holder"
            )
        )
    if not module.check_mode and changes:
        # what the node was, before anything is touched; a second lock keeps the first record
        for item in changes:
            recorded.setdefault("%s|%s" % (item["knob"], item["target"]), item)
        ctx.save_state(STATE, dict(state, locked=True, previous=recorded))
        for item in changes:
            if item["how"] == "holder":
                holder = env_knobs.start_holder(ctx, sys.executable)
            else:
                env_knobs.apply(ctx, item)
        ctx.save_state(STATE, dict(state, locked=True, previous=recorded, holder_pid=holder))
    return changes, skipped


def restore(module, ctx, state):
    changes = []
    for item in state.get("previous", {}).values():
        if item["how"] == "holder":
            if env_knobs.holder_alive(state.get("holder_pid")):
                changes.append(dict(item, before="held at 0 us", after="released"))
            continue
        current = _current(ctx, item)
        if current != item["before"]:
            changes.append(dict(item, before=current, after=item["before"], restoring=True))
    if not module.check_mode and (changes or state):
        for item in changes:
            if item["how"] == "holder":
                env_knobs.stop_holder(state.get("holder_pid"))
            else:
                env_knobs.apply(ctx, item)
        ctx.save_state(STATE, {"locked": False, "previous": {}, "holder_pid": None})
    return changes


def _current(ctx, item):
    if item["how"] == "file":
        return ctx.read(item["target"])
    if item["how"] == "ip":
        return ctx.read("/sys/class/net/%s/mtu" % item["target"])
    if item["how"] == "grub":
        return env_knobs.grub_cmdline(ctx, item)
    if item["how"] == "nvme":
        plan = env_knobs.plan_write_cache(ctx)
        return "1" if any(x.get("target") == item["target"] for x in plan) else "0"
    return None


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            state={"type": "str", "choices": ["locked", "restored"], "default": "locked"},
            governor={"type": "str", "default": "performance"},
            keep_cstates={"type": "int", "default": 1},
            hold_cpu_dma_latency={"type": "bool", "default": True},
            numa_balancing={"type": "bool", "default": True},
            mtu={"type": "dict", "default": {}},
            nvme_write_cache_off={"type": "bool", "default": True},
            persistent_cstates={"type": "bool", "default": False},
            bootloader={"type": "str", "default": "auto", "choices": list(env_knobs.BOOTLOADERS)},
        ),
        supports_check_mode=True,
    )
    p = module.params
    ctx = make_context(module)
    state = ctx.load_state(STATE)
    try:
        if p["state"] == "locked":
            changes, skipped = lock(module, ctx, p, state)
            mismatch = env_knobs.ib_mtu_mismatch(ctx, _interface_mtus(ctx))
        else:
            changes, skipped, mismatch = restore(module, ctx, state), [], []
    except (CollectorError, OSError) as exc:
        module.fail_json(msg="env_lock (%s): %s" % (p["state"], getattr(exc, "msg", exc)))
    reboot = any(c["knob"] == "grub" for c in changes)  # adding or removing: effective at the next boot
    fact = {
        "state": p["state"],
        "changes": len(changes),
        "skipped": skipped,
        "ib_mtu_mismatch": mismatch,
        "settings": {
            "governor": p["governor"],
            "keep_cstates": p["keep_cstates"],
            "numa_balancing_off": p["numa_balancing"],
            "mtu": p["mtu"],
            "nvme_write_cache_off": p["nvme_write_cache_off"],
        }
        if p["state"] == "locked"
        else {},
    }
    module.exit_json(
        changed=bool(changes),
        changes=changes,
        skipped_knobs=skipped,
        reboot_required=reboot,
        diff={"before": diff_text(changes, "before"), "after": diff_text(changes, "after")},
        ansible_facts={"stethoscope_env_lock": fact},
        msg=json.dumps([c["knob"] for c in changes]),
    )


def _interface_mtus(ctx):
    mtus = {}
    for interface in ctx.listdir("/sys/class/net"):
        value = ctx.read("/sys/class/net/%s/mtu" % interface)
        if interface != "lo" and value and value.isdigit():
            mtus[interface] = int(value)
    return mtus


if __name__ == "__main__":
    main()
