#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: smart_facts
short_description: SMART and NVMe health of every disk
version_added: "0.1.0"
description:
  - Runs C(smartctl -j -a) on every disk under C(/sys/block) (or the listed ones).
  - 'ATA attributes become C(smart_<name>) (raw as smartctl decodes it: the first number of its raw string) and
    C(smart_<name>_normalized); NVMe drives report percentage used, media errors, critical warning and
    available spare.'
  - 'Each ATA attribute with a threshold gives C(smart_attribute_failing) (label C(attribute): 2 at or below its
    threshold now, 1 in the past, 0 never); SAS drives give C(disk_grown_defects_total) and
    C(disk_uncorrected_errors_total) (label C(operation): read, write, verify).'
  - 'A disk behind a MegaRAID controller (listed in O(devices) as C(/dev/bus/0 -d megaraid,3)) is named
    C(bus0:megaraid,3), and its rows carry its C(serial) as a label.'
  - A disk that cannot be read (smartctl timed out, unparseable output, or it cannot open a disk the
    kernel lists) does not stop the others; the task then fails with C(collector_failed) and
    C(collector_exit_code) rows on that disk, and C(collector_disk_unreadable) where smartctl's words say
    the disk is gone (C(No such device), an I/O error); 0 once the disk answers again.
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  devices:
    description:
      - Block device names (C(sda), C(nvme0n1)); default every disk under C(/sys/block), and the disks behind a MegaRAID
        controller that C(smartctl --scan) lists, which C(/sys/block) does not show (only the controller's virtual disks).
      - A disk behind a RAID controller as C(smartctl --scan) lists it, C(PATH -d TYPE) (C(/dev/bus/0 -d megaraid,3), C(/dev/bus/0 -d sat+megaraid,3)).
      - An entry of another shape fails the task, naming it, before any disk is read.
    type: list
    elements: str
    default: []
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Collect smart facts
  aicluster.stethoscope.smart_facts:
  register: __smart

- name: Collect from a node root prefix (the lab)
  aicluster.stethoscope.smart_facts:
    root: /srv/lab/node01/root
    state_dir: /srv/lab/node01/state
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(stethoscope_smart); C(present=false) with a C(reason) where the node has no such hardware or tool.
  returned: always
  type: dict
  contains:
    stethoscope_smart:
      description: Per disk model, firmware, health verdict, ATA attributes or NVMe health log.
      returned: always
      type: dict
      sample: {"present": true, "disks": {"sda": {"model": "INTEL SSDSC2KB240G7", "health_passed": true},
               "bus0:megaraid,0": {"model": "TOSHIBA AL15SEB24EQY", "slot": "megaraid,0", "serial": "X1234",
                                   "scsi_health": {"grown_defects": 0, "uncorrected_errors": {"read": 0, "write": 0, "verify": 0}}}}}
failed_collectors:
  description: C(smart) when a disk could not be read (see C(collector_failed)).
  returned: failure
  type: list
  elements: str
stethoscope_metrics:
  description: Metric rows with catalog names (rules/metrics.yml), read by the ClickHouse callback.
  returned: always
  type: list
  elements: dict
  sample: [{"name": "gpu_temperature_celsius", "device": "gpu0", "value": 35.0, "labels": {}}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_smart
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(devices={"type": "list", "elements": "str", "default": []}),
        supports_check_mode=True,
    )
    refused = collect_smart.refused_devices(module.params["devices"])
    if refused:
        module.fail_json(msg="; ".join(refused))
    run_collectors(
        module, [("smart", lambda ctx, _done: collect_smart.collect(ctx, module.params["devices"]))]
    )


if __name__ == "__main__":
    main()
