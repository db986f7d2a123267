#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: nvlink_facts
short_description: NVLink link state and error counters
version_added: "0.1.0"
description:
  - Runs C(nvidia-smi nvlink -s) for link state, C(-e) for CRC, replay and recovery counters and C(-gt
    d) for data transferred.
  - C(nvlink_error_rate_percent) is the change in errors over the change in data (KiB) between two
    sweeps, times 100; never a cumulative value.
  - 'A GPU without NVLink prints nothing: C(present=false). Links reported inactive are facts with C(nvlink_link_up=0).'
extends_documentation_fragment:
  - aicluster.stethoscope.node
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Collect nvlink facts
  aicluster.stethoscope.nvlink_facts:
  register: __nvlink

- name: Collect from a node root prefix (the lab)
  aicluster.stethoscope.nvlink_facts:
    root: /srv/lab/node01/root
    state_dir: /srv/lab/node01/state
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(stethoscope_nvlink); C(present=false) with a C(reason) where the node has no such hardware or tool.
  returned: always
  type: dict
  contains:
    stethoscope_nvlink:
      description: Link state per GPU and the error counters.
      returned: always
      type: dict
      sample: {"present": false, "reason": "no GPU reports NVLink (nvidia-smi nvlink -s printed nothing)"}
stethoscope_metrics:
  description: Metric rows with catalog names (rules/metrics.yml), read by the ClickHouse callback.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu_temperature_celsius", "device": "gpu0", "value": 35.0, "labels": {}}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_nvlink
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    run_collectors(module, [("nvlink", lambda ctx, _done: collect_nvlink.collect(ctx))])


if __name__ == "__main__":
    main()
