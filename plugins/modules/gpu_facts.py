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
  - Under the same cursor, NVRM lines without an Xid prefix that say the driver lost a GPU (C(GPU has
    fallen off the bus), the multi-line C(The NVIDIA GPU ... has fallen off the bus) at driver load,
    C(RmInitAdapter failed)) count C(gpu_lost_events_total) (label C(reason)), apart from the Xid 79
    line of the same incident; NVSwitch SXid lines count C(nvswitch_sxid_errors_total) on C(nvswitchN)
    (labels C(sxid), C(severity)). Their new events are in the facts' C(xid.events) with a C(kind).
  - When C(nvidia-smi -q -x) fails the kernel log is still read (a lost GPU's Xid 79 is there), with the
    GPUs named as the last good sweep saw them (kept in the state file). The task then fails and still
    returns every row, among them C(collector_failed) (labels C(collector), C(tool), C(rc), C(cause)),
    C(collector_exit_code) and, when the tool's words say a GPU is lost (C(Unable to determine the
    device handle), C(GPU is lost), exit code 255, or C(No devices were found) on a node that had GPUs),
    C(collector_gpu_lost) on that GPU. They go back to 0 when nvidia-smi answers again.
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
  - stethoscope developers (@aicluster)
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
    stethoscope_gpu.failures:
      description: >-
        When nvidia-smi failed: per failure the tool, exit code, cause (C(gpu_lost) or C(tool_failed)),
        the tool's first line, the device and the message.
      returned: failure
      type: list
      elements: dict
      sample: [{"tool": "nvidia-smi", "rc": 255, "cause": "gpu_lost", "device": "gpu0",
                "first_line": "Unable to determine the device handle for GPU 0000:C1:00.0: GPU is lost."}]
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
