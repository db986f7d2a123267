#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_node
short_description: Drain a Slurm node for a stethoscope finding, or resume one that stethoscope drained
version_added: "0.1.0"
description:
  - Reads the node with C(scontrol -o show node), and drains it with C(scontrol update NodeName=... State=DRAIN Reason=...) or resumes it with C(State=RESUME).
  - "A node already drained for another reason is left as it is (C(changed=false), the reason kept): a drain is never re-issued over an existing one."
  - "Resuming is refused unless the node's current drain reason is the one given in O(reason) (stethoscope's
    C(stethoscope: <rule> <txn>)), so a node drained by a human, or for another transaction, is never
    resumed."
  - Idempotent; check mode and diff report what would change and run no update.
  - On a node whose slurmd has never answered, Slurm clears the DRAIN flag and still answers "Invalid node state
    specified"; success is judged by reading the node again, not by that exit code.
options:
  name:
    description: The node's name in Slurm (the inventory's C(slurm_name)); letters, digits, C(.), C(_), C(-), not starting with C(-).
    type: str
    required: true
  state:
    description: C(drained) or C(resumed).
    type: str
    choices: [drained, resumed]
    required: true
  reason:
    description:
      - For C(drained), the drain reason to set; for C(resumed), the reason the node must carry to be resumed.
    type: str
    required: true
  timeout:
    description: Seconds each scontrol call may take.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    description: Reads the node and reports what would change; no C(scontrol update) runs.
  diff_mode:
    support: full
    description: The node's drained flag and drain reason before and after.
  facts:
    support: none
    description: Returns no facts; the node as Slurm shows it is in C(node).
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Drain the node for a worn SSD
  aicluster.stethoscope.slurm_node:
    name: "{{ slurm_name | default(inventory_hostname) }}"
    state: drained
    reason: "stethoscope: ssd_reallocated_sectors 1a2b3c4d5e6f"
  delegate_to: localhost

- name: Resume it after a green verification, only if that drain is still in place
  aicluster.stethoscope.slurm_node:
    name: node07
    state: resumed
    reason: "stethoscope: ssd_reallocated_sectors 1a2b3c4d5e6f"
"""

RETURN = r"""
node:
  description: The node as read after the change (or as it was, in check mode).
  returned: always
  type: dict
  sample: {"name": "node07", "state": "DOWN", "flags": ["DRAIN", "NOT_RESPONDING"], "drained": true, "reason":
    "stethoscope: ssd_reallocated_sectors 1a2b3c4d5e6f"}
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.slurm import parse_show_node

# the controller's one node-name rule (stethoscope/names.py), repeated here: a module cannot import it
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
ENV = {"LANGUAGE": "C", "LC_ALL": "C"}


def _scontrol(module, argv):
    binary = module.get_bin_path("scontrol", required=True)
    command = [module.get_bin_path("timeout") or "timeout", str(module.params["timeout"]), binary, *argv]
    return command, module.run_command(command, environ_update=ENV, expand_user_and_vars=False)


def read_node(module, name):
    command, (rc, out, err) = _scontrol(module, ["-o", "show", "node", name])
    if rc != 0:
        module.fail_json(
            msg="scontrol: cannot read node %s" % name, cmd=command, rc=rc, stdout=out, stderr=err
        )
    try:
        return parse_show_node(out)
    except ParseError as exc:
        module.fail_json(msg=str(exc), cmd=command, rc=rc, stdout=out, stderr=err)


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "state": {"type": "str", "required": True, "choices": ["drained", "resumed"]},
            "reason": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    name, state, reason = module.params["name"], module.params["state"], module.params["reason"].strip()
    if not NAME.fullmatch(name):
        module.fail_json(msg="slurm_node: %r is not a valid node name" % name)
    if not reason or "\n" in reason:
        module.fail_json(msg="slurm_node: the reason must be one non-empty line")
    before = read_node(module, name)
    if state == "drained":
        if before["drained"] and before["reason"] != reason:
            # a drain is never re-issued over another: the reason keeps the first (a human's, a txn's)
            module.exit_json(
                changed=False,
                node=before,
                msg="slurm_node: %s is already drained for %r: kept, not re-drained"
                % (name, before["reason"]),
            )
        changed = not before["drained"]
        update = ["update", "NodeName=%s" % name, "State=DRAIN", "Reason=%s" % reason]
    else:
        if before["drained"] and before["reason"] != reason:
            module.fail_json(
                msg="slurm_node: %s is drained for %r, not %r: not resuming a drain stethoscope does not hold"
                % (name, before["reason"], reason),
                node=before,
            )
        changed = before["drained"]
        update = ["update", "NodeName=%s" % name, "State=RESUME"]
    diff = {
        "before": {"drained": before["drained"], "reason": before["reason"]},
        "after": {"drained": state == "drained", "reason": reason if state == "drained" else ""},
    }
    if not changed or module.check_mode:
        module.exit_json(changed=changed, node=before, diff=diff)
    command, (rc, out, err) = _scontrol(module, update)
    after = read_node(module, name)
    done = after["drained"] and after["reason"] == reason if state == "drained" else not after["drained"]
    if not done:
        module.fail_json(
            msg="slurm_node: scontrol did not %s %s" % ("drain" if state == "drained" else "resume", name),
            cmd=command,
            rc=rc,
            stdout=out,
            stderr=err,
            node=after,
        )
    module.exit_json(changed=True, node=after, diff=diff, stderr=err)


if __name__ == "__main__":
    main()
