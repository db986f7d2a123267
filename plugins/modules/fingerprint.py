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
  count_changes:
    description:
      - Count changes of the node fingerprint across runs in I(state_dir) and return them as
        C(node_fingerprint_changes_total) (kind events; collect.yml does, so that a driver upgrade or
        a swapped part triggers a re-baseline). The first run on a node counts 0.
    type: bool
    default: false
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
stethoscope_metrics:
  description: With I(count_changes), C(node_fingerprint_changes_total) (device C(node)), the changes of the node fingerprint seen across runs (0 at the first run on a node).
  returned: when count_changes
  type: list
  elements: dict
fingerprint_change:
  description: With I(count_changes), the change this run saw (from, to, class_from, class_to, fields), or null.
  returned: when count_changes
  type: dict
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
