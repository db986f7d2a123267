#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: rdma_facts
short_description: RDMA / InfiniBand port state, counters and queue pairs
version_added: "0.1.0"
description:
  - 'Reads C(/sys/class/infiniband/*/ports/*): state, physical state, rate, counters (64-bit where the driver has them) and hw_counters.'
  - A legacy counter at its maximum (8-bit C(link_downed) stops at 255) is reported with label
    C(saturated=1).
  - Active MTU from C(ibv_devinfo) (sysfs lacks it); queue pairs in ERR from C(rdma -j res show qp);
    C(ibstat) where sysfs has no InfiniBand class.
  - C(rdma_qps_dropped_per_second) is the rate of out_of_buffer plus physical receive discards between
    sweeps.
  - C(ib_port_ipoib_mtu_excess_bytes) (label C(interface)) is, per InfiniBand port, an IPoIB interface's
    MTU plus its 4-byte header less the port's active MTU; above 0 the interface sends frames the port
    cannot carry.
  - An HCA an earlier sweep saw that is gone from sysfs, C(ibstat) failing to stat an IB device it
    listed, or C(ibv_devinfo) finding no device while sysfs lists HCAs fails the task with
    C(collector_failed), C(collector_exit_code) and C(collector_hca_missing) rows (0 once the
    collector answers again), beside the rows of the HCAs still there; the fact C(failures) keeps the
    tool's first line. A gone HCA is reported every sweep until it is back; one removed or renamed on
    purpose is forgotten by deleting the node's C(rdma_devices) state file in the module's state
    folder.
extends_documentation_fragment:
  - aicluster.stethoscope.node
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Collect rdma facts
  aicluster.stethoscope.rdma_facts:
  register: __rdma

- name: Collect from a node root prefix (the lab)
  aicluster.stethoscope.rdma_facts:
    root: /srv/lab/node01/root
    state_dir: /srv/lab/node01/state
"""

RETURN = r"""
ansible_facts:
  description: Facts under C(stethoscope_rdma); C(present=false) with a C(reason) where the node has no such hardware or tool.
  returned: always
  type: dict
  contains:
    stethoscope_rdma:
      description: Ports keyed C(hca/port) with state, rate, counters, active MTU and queue pairs.
      returned: always
      type: dict
      sample: {"present": true, "source": "sysfs", "ports": {"mlx5_0/1": {"state": 4, "rate_gbit_per_s": 400.0}}}
failed_collectors:
  description: C(rdma) when its tool failed (see C(collector_failed)).
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

from ansible_collections.aicluster.stethoscope.plugins.module_utils import collect_rdma
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    run_collectors,
)


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    run_collectors(module, [("rdma", lambda ctx, _done: collect_rdma.collect(ctx))])


if __name__ == "__main__":
    main()
