#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_facts
short_description: GPU health facts from nvidia-smi and the kernel log
version_added: "0.1.0"
description:
  - Runs C(nvidia-smi -q -x) and C(nvidia-smi dmon), and reads XID events from the kernel log
    (C(dmesg)).
  - Reports ECC volatile and aggregate counts, retired pages, remapped rows (pending, failure), clock
    event (throttle) reasons as NVML's bitmask for old and new drivers alike, temperatures, power,
    clocks, utilisation, memory, PCIe generation and width, the replay counter, PCIe rx/tx and
    violations.
  - XID counts are cumulative per GPU and code; a cursor (boot id and position) in the state file makes
    sure a reboot neither loses nor repeats an event.
  - The first read on a node (no cursor yet) sets the cursor at the end of the current log; the XIDs
    already there are pre-existing, not new, they are reported in C(xid_preexisting) and as
    C(gpu_xid_preexisting_total) rows, and their C(gpu_xid_errors_total) series start at 0.
    In check mode the cursor is not written.
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  dmon_samples:
    description: Samples C(nvidia-smi dmon) takes (one a second) for PCIe throughput and violations.
    type: int
    default: 1
  read_kernel_log:
    description: Read XID events from C(dmesg) (may need root where C(kernel.dmesg_restrict=1)).
    type: bool
    default: true
author:
  - stethoscope developers
"""

EXAMPLES = r"""
- name: Collect gpu facts
  aicluster.stethoscope.gpu_facts:
  register: __gpu

- name: Collect from a node root prefix (the lab)
  aicluster.stethoscope.gpu_facts:
    root: /srv/lab/node01/root
    state_dir: /srv/lab/node01/state
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(stethoscope_gpu); C(present=false) with a C(reason) where the node has no such hardware or tool.
  returned: always
  type: dict
  contains:
    stethoscope_gpu:
      description: >-
        Driver, per-GPU readings, the XID events new since the last sweep and, on the first read of
        the kernel log, the XID counts already there per device and code (C(xid_preexisting)).
      returned: always
      type: dict
      sample: {"present": true, "driver_version": "580.159.04", "gpus": [{"device": "gpu0", "name": "NVIDIA H200"}],
               "xid_preexisting": {"gpu0": {"79": 1}}}
stethoscope_metrics:
  description: Metric rows with catalog names (rules/metrics.yml), read by the ClickHouse callback.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu_temperature_celsius", "device": "gpu0", "value": 35.0, "labels": {}}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_gpu
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            dmon_samples={"type": "int", "default": 1}, read_kernel_log={"type": "bool", "default": True}
        ),
        supports_check_mode=True,
    )
    run_collectors(
        module,
        [
            (
                "gpu",
                lambda ctx, _done: collect_gpu.collect(
                    ctx, module.params["dmon_samples"], module.params["read_kernel_log"]
                ),
            )
        ],
    )


if __name__ == "__main__":
    main()
