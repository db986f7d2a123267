#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: fingerprint
short_description: Class and node fingerprints of a node, for keying benchmark results
version_added: "0.1.0"
description:
  - 'The class fingerprint hashes what identical nodes share: GPU models and count, driver, VBIOS, NIC models and firmware, NVMe models and firmware, BIOS version, kernel version, a hash of the kernel command line, and the env_lock state.'
  - The node fingerprint hashes the class plus serial numbers (GPUs, NVMe drives, board, product); a swapped GPU starts a new segment of the node's own history.
extends_documentation_fragment:
  - aicluster.stethoscope.node
options:
  env_lock_state:
    description: The state env_lock set (its C(stethoscope_env_lock) fact), part of the class.
    type: dict
    default: {}
author:
  - stethoscope developers
"""

EXAMPLES = r"""
- name: Fingerprint the node
  aicluster.stethoscope.fingerprint:
    env_lock_state: "{{ ansible_facts['stethoscope_env_lock'] | default({}) }}"
  register: __fingerprint
"""

RETURN = r"""
stethoscope_fingerprint:
  description: C(class_fingerprint), C(node_fingerprint) (16 hex digits each) and the C(detail) they hash.
  returned: always
  type: dict
  sample: {"class_fingerprint": "3f1c0a9e5b7d2c11", "node_fingerprint": "9ab0c3d4e5f60718", "detail": {"kernel": "6.18.0"}}
ansible_facts:
  description: The same under C(stethoscope_fingerprint).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector import CollectorError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.fingerprint import fingerprint
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import (
    argument_spec,
    make_context,
)


def main():
    module = AnsibleModule(
        argument_spec=argument_spec(env_lock_state={"type": "dict", "default": {}}), supports_check_mode=True
    )
    try:
        result = fingerprint(make_context(module), module.params["env_lock_state"])
    except CollectorError as exc:
        module.fail_json(msg=exc.msg, cmd=exc.cmd, rc=exc.rc, stdout=exc.stdout, stderr=exc.stderr)
    module.exit_json(
        changed=False, stethoscope_fingerprint=result, ansible_facts={"stethoscope_fingerprint": result}
    )


if __name__ == "__main__":
    main()
