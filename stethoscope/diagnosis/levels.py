"""What a finding is called and what its level does, below both kinds of finding (the rules' in
findings.py, the model's in model_findings.py): severities in order, each level's default actions, a
finding's id and an action's printed label."""

from __future__ import annotations

import hashlib

from stethoscope.diagnosis.rules import Action

SEVERITY_ORDER = {"info": 0, "warning": 1, "unknown": 1, "critical": 2}
DEFAULT_LEVEL = {"info": "L1", "warning": "L2", "unknown": "L2", "critical": "L3"}
_LOG, _ALERT = Action("log", ()), Action("alert", ())
_EVIDENCE = Action("playbook", (("playbook", "remediate/evidence.yml"),))
_TICKET = Action("playbook", (("playbook", "remediate/ticket.yml"),))
_DRAIN = Action("playbook", (("playbook", "remediate/drain.yml"),))
# L4 isolates first, so that no new job lands on the node while evidence is collected
LEVEL_ACTIONS = {
    "L1": (_LOG,),
    "L2": (_LOG, _ALERT),
    "L3": (_LOG, _ALERT, _EVIDENCE, _TICKET),
    "L4": (_LOG, _ALERT, _DRAIN, _EVIDENCE, _TICKET),
}


def finding_id(rule_id: str, node_id: str, device: str) -> str:
    return hashlib.sha256(f"{rule_id}|{node_id}|{device}".encode()).hexdigest()[:16]


def action_label(action: Action) -> str:
    params = dict(action.params)
    if action.type == "playbook":
        return f"playbook:{params['playbook']}"
    return action.type
