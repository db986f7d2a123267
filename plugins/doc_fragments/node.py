# Copyright: stethoscope developers
# Apache License 2.0
"""Options and attributes shared by every stethoscope fact module."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  root:
    description:
      - Prefix under which C(/sys), C(/proc) and C(/dev) are read, like node_exporter's C(--path.rootfs).
      - The lab cluster points each simulated node at its own root.
    type: path
    default: /
  state_dir:
    description:
      - Folder for the module's small state file (previous counters for rates, the kernel log cursor).
      - Not written in check mode; keeping it is bookkeeping and never reports C(changed).
    type: path
    default: /var/lib/stethoscope
  timeout:
    description:
      - Seconds each external command may run before it is killed (nvidia-smi hangs on a sick GPU).
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    description: Reads only; state files are not written in check mode.
  diff_mode:
    support: none
    description: Changes nothing on the node, so there is no diff to show.
  facts:
    support: full
    description: Returns its readings as facts too, under C(ansible_facts.stethoscope_<name>).
notes:
  - Missing tool or hardware gives C(present=false) and no metric rows; hardware that is there but
    unhealthy is reported with its values.
  - Output a parser does not understand fails the task naming the tool and the first bad line.
"""
