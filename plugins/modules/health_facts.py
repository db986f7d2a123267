#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: health_facts
short_description: Every stethoscope health collector in one module invocation
version_added: "0.1.0"
description:
  - Runs the collectors of M(aicluster.stethoscope.gpu_facts), M(aicluster.stethoscope.nvlink_facts),
    M(aicluster.stethoscope.pcie_aer_facts), M(aicluster.stethoscope.rdma_facts),
    M(aicluster.stethoscope.smart_facts) and M(aicluster.stethoscope.tuning_facts) in one process, so a
    sweep costs one module transfer per host instead of six.
  - Each collector runs even when another fails; the task then fails naming every collector that could
    not answer, and still returns the metric rows of those that did.
  - A collector's failure (timed out, non-zero exit, unparseable output) is itself rows,
    C(collector_failed) 1 (labels C(collector), C(tool), C(rc), C(cause)), C(collector_exit_code), and
    where the tool's words mean hardware C(collector_gpu_lost), C(collector_hca_missing) or
    C(collector_disk_unreadable) on the device it could not read; 0 once the collector answers again.
    The collector's fact carries C(failures) with the tool's first line.
  - GPUs busy in this sweep (utilisation above zero) are passed to the PCIe collector, for which a lower
    link speed then counts as degradation.
  - With I(fingerprint), the node is first fingerprinted as M(aicluster.stethoscope.fingerprint) with
    I(count_changes) does it, in the same invocation, so that a sweep (C(playbooks/collect.yml)) costs one
    module run per host; it and the GPU collector read one C(nvidia-smi -q -x). Its failure is a collector's
    failure, named C(fingerprint); the collectors still run.
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  collectors:
    description: Which collectors to run, in this order.
    type: list
    elements: str
    choices: [gpu, nvlink, pcie_aer, rdma, smart, tuning]
    default: [gpu, nvlink, pcie_aer, rdma, smart, tuning]
  dmon_samples:
    description: Samples C(nvidia-smi dmon) takes (one a second).
    type: int
    default: 1
  read_kernel_log:
    description: Read XID events from C(dmesg).
    type: bool
    default: true
  fingerprint:
    description:
      - Fingerprint the node before the collectors and count changes of its node fingerprint across runs
        in I(state_dir), as M(aicluster.stethoscope.fingerprint) with I(count_changes) does (the first run on
        a node counts 0). In check mode the count is not saved.
    type: bool
    default: false
    version_added: "1.0.0"
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Sweep every health collector
  aicluster.stethoscope.health_facts:

- name: Only storage and tuning
  aicluster.stethoscope.health_facts:
    collectors: [smart, tuning]

- name: A whole sweep, the fingerprint included (what playbooks/collect.yml runs)
  aicluster.stethoscope.health_facts:
    fingerprint: true
"""

RETURN = r"""
ansible_facts:
  description:
    - One C(stethoscope_<collector>) fact per collector that answered (see the single modules).
    - With I(fingerprint), C(stethoscope_fingerprint) as M(aicluster.stethoscope.fingerprint) returns it.
  returned: always
  type: dict
stethoscope_metrics:
  description:
    - Metric rows with catalog names from every collector that answered.
    - With I(fingerprint), first C(node_fingerprint_changes_total) (device C(node)), the changes of the node
      fingerprint seen across runs.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "ib_port_state", "device": "mlx5_0/1", "value": 4.0, "labels": {}}]
failed_collectors:
  description: Collectors whose tool failed; their facts carry C(failures) and their rows C(collector_failed).
  returned: failure
  type: list
  elements: str
fingerprint_change:
  description: With I(fingerprint), the change this run saw (from, to, class_from, class_to, fields), or null.
  returned: when fingerprint is true and it could be read
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import (
    collect_gpu,
    collect_nvlink,
    collect_pcie,
    collect_rdma,
    collect_smart,
    collect_tuning,
    fingerprint,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)

ORDER = ("gpu", "nvlink", "pcie_aer", "rdma", "smart", "tuning")


def busy_gpu_addresses(done):
    """PCI addresses of GPUs with utilisation above zero, in sysfs form (0000:19:00.0)."""
    gpu = done.get("gpu") or {}
    busy = []
    for entry in gpu.get("facts", {}).get("gpus", []):
        if (entry.get("utilization_percent") or 0) > 0 and entry.get("bus_id"):
            busy.append(entry["bus_id"].lower()[-12:])
    return busy


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            collectors={"type": "list", "elements": "str", "choices": list(ORDER), "default": list(ORDER)},
            dmon_samples={"type": "int", "default": 1},
            read_kernel_log={"type": "bool", "default": True},
            fingerprint={"type": "bool", "default": False},
        ),
        supports_check_mode=True,
    )
    params = module.params
    available = {
        "gpu": lambda ctx, _done: collect_gpu.collect(ctx, params["dmon_samples"], params["read_kernel_log"]),
        "nvlink": lambda ctx, _done: collect_nvlink.collect(ctx),
        "pcie_aer": lambda ctx, done: collect_pcie.collect(ctx, busy_gpu_addresses(done)),
        "rdma": lambda ctx, _done: collect_rdma.collect(ctx),
        "smart": lambda ctx, _done: collect_smart.collect(ctx),
        "tuning": lambda ctx, _done: collect_tuning.collect(ctx),
    }
    wanted = [(name, available[name]) for name in ORDER if name in params["collectors"]]
    if params["fingerprint"]:
        wanted.insert(0, ("fingerprint", lambda ctx, _done: fingerprint.collect(ctx)))
    run_collectors(module, wanted)


if __name__ == "__main__":
    main()
