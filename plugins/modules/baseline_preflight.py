#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: baseline_preflight
short_description: Benchmarks never run under a job - the Slurm preflight of baseline.yml
version_added: "0.2.0"
description:
  - 'O(check=node): reads the node (C(scontrol -o show node)); a node not yet drained is drained with
    the reason C(stethoscope: baseline <txn>) and read again. Drained with no job (DRAINED): run. A
    job still there (DRAINING): resumed at once and skipped with the reason. A remediation drain
    (C(stethoscope: <rule> <txn>)) runs and stays drained for verify; anyone else''s drain, and a node
    whose slurmd does not answer (C(*) in C(sinfo)), are skipped with the reason and not touched.'
  - 'O(check=capacity): whether a batch may start: the nodes Slurm already shows out of service
    (DRAIN, DOWN, not responding; baseline drains not counted) against O(max_out_of_service).'
  - Slurm configured and unreachable is a failure (the preflight refuses), never a silent run.
options:
  check:
    description: C(node) or C(capacity).
    type: str
    choices: [node, capacity]
    default: node
  name:
    description: The node's name in Slurm (for O(check=node)).
    type: str
  txn_id:
    description: The baseline run's transaction id (letters, digits, C(_), C(-)).
    type: str
    required: true
  max_out_of_service:
    description: For O(check=capacity), how many nodes may already be out of service.
    type: int
    default: 1
  timeout:
    description: Seconds each scontrol call may take.
    type: int
    default: 30
attributes:
  check_mode:
    support: full
    description: Reads the node and says what it would do; it neither drains nor resumes in check mode.
  diff_mode:
    support: none
    description: Returns the node as read and the decision with its reason, not a diff.
  facts:
    support: none
    description: Returns no facts.
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: Drain for the baseline, or say why not
  aicluster.stethoscope.baseline_preflight:
    name: "{{ slurm_name | default(inventory_hostname) }}"
    txn_id: "{{ baseline_txn_id }}"
  delegate_to: localhost
  register: __baseline_preflight
"""

RETURN = r"""
run:
  description: Whether the suites run on the node.
  returned: check=node
  type: bool
reason:
  description: Why (the skip reason a human reads).
  returned: always
  type: str
drained:
  description: Whether this call drained the node for the baseline (the play's always resumes only those).
  returned: check=node
  type: bool
node:
  description: The node as Slurm shows it after the preflight.
  returned: check=node
  type: dict
capacity_ok:
  description: Whether a batch may start.
  returned: check=capacity
  type: bool
out_of_service:
  description: Names of the nodes already out of service.
  returned: check=capacity
  type: list
  elements: str
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError
from ansible_collections.aicluster.stethoscope.plugins.module_utils.slurm import (
    baseline_reason,
    out_of_service,
    parse_show_node,
    preflight_decision,
)

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
TXN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ENV = {"LANGUAGE": "C", "LC_ALL": "C"}


def scontrol(module, argv):
    binary = module.get_bin_path("scontrol")
    if not binary:
        module.fail_json(
            msg="baseline_preflight: Slurm is configured but scontrol is not installed: refusing"
        )
    command = [module.get_bin_path("timeout") or "timeout", str(module.params["timeout"]), binary, *argv]
    rc, out, err = module.run_command(command, environ_update=ENV, expand_user_and_vars=False)
    return command, rc, out, err


def read_node(module, name):
    command, rc, out, err = scontrol(module, ["-o", "show", "node", name])
    if rc != 0:
        module.fail_json(
            msg="baseline_preflight: Slurm does not answer for %s: refusing to benchmark (exit %s)"
            % (name, rc),
            cmd=command,
            rc=rc,
            stdout=out,
            stderr=err,
        )
    try:
        return parse_show_node(out)
    except ParseError as exc:
        module.fail_json(msg=str(exc), cmd=command, rc=rc, stdout=out, stderr=err)


def capacity(module):
    command, rc, out, err = scontrol(module, ["-o", "show", "node"])
    if rc != 0:
        module.fail_json(
            msg="baseline_preflight: Slurm does not answer: refusing to start a batch (exit %s)" % rc,
            cmd=command,
            rc=rc,
            stdout=out,
            stderr=err,
        )
    nodes = []
    for line in out.splitlines():
        if line.strip():
            try:
                nodes.append(parse_show_node(line))
            except ParseError as exc:
                module.fail_json(msg=str(exc), cmd=command, rc=rc, stdout=out, stderr=err)
    out_names = out_of_service(nodes)
    limit = module.params["max_out_of_service"]
    ok = len(out_names) <= limit
    module.exit_json(
        changed=False,
        capacity_ok=ok,
        out_of_service=out_names,
        reason="%d node(s) out of service (limit %d)%s"
        % (len(out_names), limit, "" if ok else ": the batch waits"),
    )


def update(module, name, argv):
    scontrol(module, ["update", "NodeName=%s" % name, *argv])  # judged by reading the node again
    return read_node(module, name)


def main():
    module = AnsibleModule(
        argument_spec={
            "check": {"type": "str", "choices": ["node", "capacity"], "default": "node"},
            "name": {"type": "str"},
            "txn_id": {"type": "str", "required": True},
            "max_out_of_service": {"type": "int", "default": 1},
            "timeout": {"type": "int", "default": 30},
        },
        required_if=[("check", "node", ["name"])],
        supports_check_mode=True,
    )
    p = module.params
    if not TXN.match(p["txn_id"]):
        module.fail_json(msg="baseline_preflight: %r is not a valid transaction id" % p["txn_id"])
    if p["check"] == "capacity":
        capacity(module)
    name = p["name"]
    if not NAME.match(name):
        module.fail_json(msg="baseline_preflight: %r is not a valid node name" % name)
    reason = baseline_reason(p["txn_id"])
    node = read_node(module, name)
    action, why = preflight_decision(node, reason)
    drained = False
    if action == "drain":
        if module.check_mode:
            module.exit_json(
                changed=True, run=False, drained=False, node=node, reason="would drain %s" % name
            )
        node = update(module, name, ["State=DRAIN", "Reason=%s" % reason])
        if not (node["drained"] and node["reason"] == reason):
            module.fail_json(msg="baseline_preflight: scontrol did not drain %s" % name, node=node)
        drained = True
        action, why = preflight_decision(node, reason)
    if action == "resume" and not module.check_mode:
        node = update(module, name, ["State=RESUME"])
        drained = False
    module.exit_json(
        changed=drained or action == "resume",
        run=action == "run",
        drained=drained or (action == "run" and node["reason"] == reason),
        node=node,
        reason=why,
    )


if __name__ == "__main__":
    main()
