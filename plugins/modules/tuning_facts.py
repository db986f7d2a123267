#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: tuning_facts
short_description: Tuning state that makes benchmarks comparable
version_added: "0.1.0"
description:
  - Reads the CPU frequency governor, C-state limits (cpuidle and C(intel_idle.max_cstate)), NUMA
    balancing, every interface's MTU, the NVMe volatile write cache (C(nvme get-feature --feature-
    id=0x06)) and the kernel command line.
  - A knob the node lacks (a VM without cpufreq) is reported as absent with the reason, never as a
    failure.
extends_documentation_fragment:
  - aicluster.stethoscope.node
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Collect tuning facts
  aicluster.stethoscope.tuning_facts:
  register: __tuning

- name: Collect from a node root prefix (the lab)
  aicluster.stethoscope.tuning_facts:
    root: /srv/lab/node01/root
    state_dir: /srv/lab/node01/state
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(stethoscope_tuning); C(present=false) with a C(reason) where the node has no such hardware or tool.
  returned: always
  type: dict
  contains:
    stethoscope_tuning:
      description: Governors per CPU, C-state facts, NUMA balancing, MTUs, write cache per controller, cmdline and its hash.
      returned: always
      type: dict
      sample: {"present": true, "cpufreq": false, "numa_balancing": 0, "kernel_cmdline_sha256": "3b1f..."}
stethoscope_metrics:
  description: Metric rows with catalog names (rules/metrics.yml), read by the ClickHouse callback.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu_temperature_celsius", "device": "gpu0", "value": 35.0, "labels": {}}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_tuning
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    run_collectors(module, [("tuning", lambda ctx, _done: collect_tuning.collect(ctx))])


if __name__ == "__main__":
    main()
