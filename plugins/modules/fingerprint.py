#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: fingerprint
short_description: Class and node fingerprints of a node, for keying benchmark results
version_added: "0.1.0"
description:
  - 'The class fingerprint hashes what identical nodes share: GPU models and count, driver, VBIOS, NIC (RDMA
    HCA) models, firmware and PSID, NVMe models and firmware, SATA/SAS disk vendors, models and firmware
    (where the node has such disks), BIOS version, kernel version, a hash of the kernel command line, and the
    env_lock state. A firmware update of any of these changes the class.'
  - 'The node fingerprint hashes the class plus the identities of its parts: GPU and NVMe serials; per RDMA HCA
    its node, system-image and InfiniBand port GUIDs; the permanent addresses of the physical Ethernet ports;
    SATA/SAS disk serials (SCSI VPD page 0x80, else the C(wwid)); board and product serials. A part swapped
    for an identical one starts a new segment of the node''s own history and leaves the class alone.'
  - 'Each HCA''s board serial and part number (C(SN) and C(PN) of its PCI VPD) are returned in
    C(detail.nic_boards) for people; they are hashed only for an HCA without GUIDs, since VPD is read from the
    card each time and is root-only on most kernels (a run that cannot read it is not a swap).'
  - Removable, USB, iSCSI and Fibre Channel disks are not part of either fingerprint; behind a RAID controller the disks seen are its logical volumes.
  - VPD that cannot be decoded leaves that serial out and is returned as a warning.
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  env_lock_state:
    description: The state env_lock set (its C(stethoscope_env_lock) fact), part of the class.
    type: dict
    default: {}
  count_changes:
    description:
      - Count changes of the node fingerprint across runs in I(state_dir) and return them as
        C(node_fingerprint_changes_total) (kind events, so that a driver upgrade or a swapped part
        triggers a re-baseline; collect.yml's sweep does the same inside M(aicluster.stethoscope.health_facts)
        with I(fingerprint), in the same state). The first run on a node counts 0.
    type: bool
    default: false
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Fingerprint the node
  aicluster.stethoscope.fingerprint:
    env_lock_state: "{{ ansible_facts['stethoscope_env_lock'] | default({}) }}"
  register: __fingerprint
"""

RETURN = r"""
stethoscope_metrics:
  description: With I(count_changes), C(node_fingerprint_changes_total) (device C(node)), the changes of the
    node fingerprint seen across runs (0 at the first run on a node).
  returned: when count_changes
  type: list
  elements: dict
fingerprint_change:
  description: With I(count_changes), the change this run saw (from, to, class_from, class_to, fields), or null.
  returned: when count_changes
  type: dict
stethoscope_fingerprint:
  description:
    - C(present) (true, as in every collector's fact), C(class_fingerprint), C(node_fingerprint) (16 hex digits
      each), the C(detail) they hash and C(warnings) (VPD that could not be decoded, also given as task warnings).
    - C(detail.serials) (hashed into the node fingerprint) holds C(gpu), C(nvme), C(disk) (lists of serials),
      C(nic) (per HCA C(node_guid), C(sys_image_guid), C(port_guids), and C(serial) only where it has no
      GUID), C(ethernet) (permanent addresses), C(board) and C(product).
    - C(detail.nic_boards) (not hashed) lists per HCA its C(node_guid), C(serial) and C(part) from the PCI VPD
      (null where unreadable); C(detail.disks) (vendor, model, firmware per SATA/SAS disk, part of the class)
      is present only where there are such disks.
  returned: always
  type: dict
  sample: {"present": true, "class_fingerprint": "3f1c0a9e5b7d2c11", "node_fingerprint": "9ab0c3d4e5f60718", "detail": {"kernel":
    "6.18.0", "serials": {"nic": [{"node_guid": "a088:c203:00e3:142a", "sys_image_guid":
    "a088:c203:00e3:142a", "port_guids": ["a288:c2ff:fee3:142a"]}], "disk": ["S455NY0M123456"], "ethernet":
    ["3c:ec:ef:12:34:56"]}, "nic_boards": [{"node_guid": "a088:c203:00e3:142a", "serial": "MT2340J88735",
    "part": "MCX75310AAS-NEAT"}]}, "warnings": []}
ansible_facts:
  description: The same under C(stethoscope_fingerprint).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fingerprint import (
    count_change,
    fingerprint,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    make_context,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(
            env_lock_state={"type": "dict", "default": {}}, count_changes={"type": "bool", "default": False}
        ),
        supports_check_mode=True,
    )
    ctx = make_context(module)
    try:
        result = fingerprint(ctx, module.params["env_lock_state"])
    except CollectorError as exc:
        module.fail_json(msg=exc.msg, cmd=exc.cmd, rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    for warning in result["warnings"]:
        module.warn(warning)
    extra = {}
    if module.params["count_changes"]:
        row, change = count_change(ctx, result)
        extra = {"stethoscope_metrics": [row], "fingerprint_change": change}
    module.exit_json(
        changed=False,
        stethoscope_fingerprint=result,
        ansible_facts={"stethoscope_fingerprint": result},
        **extra,
    )


if __name__ == "__main__":
    main()
