#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: pcie_aer_facts
short_description: PCIe AER error counts and link degradation
version_added: "0.1.0"
description:
  - Reads C(aer_dev_correctable), C(aer_dev_nonfatal) and C(aer_dev_fatal) under C(/sys/bus/pci/devices)
    for every device (GPUs, NICs, NVMe, switch ports) as counts.
  - C(pcie_link_degraded) is 1 when the link width is below its maximum, or the speed below its maximum
    while the device is busy (GPUs lower their link speed at idle).
  - Where sysfs has no AER files, falls back to the status bits of C(lspci -vvv) (bits, not counts).
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  busy_devices:
    description: PCI addresses (C(0000:19:00.0)) of devices that are busy now, for which a lower link speed counts as degradation.
    type: list
    elements: str
    default: []
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Collect pcie_aer facts
  aicluster.stethoscope.pcie_aer_facts:
  register: __pcie_aer

- name: Collect from a node root prefix (the lab)
  aicluster.stethoscope.pcie_aer_facts:
    root: /srv/lab/node01/root
    state_dir: /srv/lab/node01/state
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(stethoscope_pcie_aer); C(present=false) with a C(reason) where the node has no such hardware or tool.
  returned: always
  type: dict
  contains:
    stethoscope_pcie_aer:
      description: Per device AER counts by error type and link attributes.
      returned: always
      type: dict
      sample: {"present": true, "aer_source": "sysfs", "devices": {"0000:19:00.0": {"aer_dev_correctable": {"RxErr": 0}}}}
stethoscope_metrics:
  description: Metric rows with catalog names (rules/metrics.yml), read by the ClickHouse callback.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu_temperature_celsius", "device": "gpu0", "value": 35.0, "labels": {}}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_pcie
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(busy_devices={"type": "list", "elements": "str", "default": []}),
        supports_check_mode=True,
    )
    run_collectors(
        module, [("pcie_aer", lambda ctx, _done: collect_pcie.collect(ctx, module.params["busy_devices"]))]
    )


if __name__ == "__main__":
    main()
