# Copyright: stethoscope developers
# Apache License 2.0
"""`scontrol -o show node NAME`: one line of Key=Value pairs; Reason is the last key and keeps its
spaces ("Reason=stethoscope: rule txn [root@2026-11-30T02:30:25]")."""

from __future__ import annotations

import re

from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import (
    ParseError,
    first_nonblank,
)

TOOL = "scontrol -o show node"
# the drain flags: a node drained (no new jobs) whether or not its jobs have finished
DRAIN_FLAGS = ("DRAIN", "DRAINING", "DRAINED")
_STAMP = re.compile(r"\s*\[[^\]]*@[^\]]*\]\s*$")


def parse_show_node(text):
    """-> {name, state, flags, drained, reason}; ParseError on anything but one node line."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("NodeName="):
        number, line = first_nonblank(text)
        raise ParseError(TOOL, "expected one line starting with NodeName=", number, line)
    line = lines[0]
    head, _sep, reason = line.partition(" Reason=")
    fields = {}
    for token in head.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    if "State" not in fields:
        raise ParseError(TOOL, "no State= field", 1, line)
    parts = fields["State"].split("+")
    flags = [p.upper() for p in parts[1:]]
    return {
        "name": fields["NodeName"],
        "state": parts[0].upper(),
        "flags": flags,
        "drained": any(flag in DRAIN_FLAGS for flag in flags) or parts[0].upper() in DRAIN_FLAGS,
        "reason": _STAMP.sub("", reason).strip(),
    }


# a job is still on the node: Slurm's DRAINING (drained for new jobs, old ones running)
BUSY = ("ALLOCATED", "MIXED", "COMPLETING")
BASELINE_PREFIX = "stethoscope: baseline "


def baseline_reason(txn_id):
    return BASELINE_PREFIX + txn_id


def preflight_decision(node, reason):
    """What baseline.yml does with a node as Slurm shows it -> (action, why). Actions: `run` (drained
    with no job), `drain` (not drained yet: drain, then decide again), `skip` (with the reason).
    A drain that is not a baseline's is never touched: a remediation drain ("stethoscope: <rule>
    <txn>") runs and stays for verify; anyone else's is skipped."""
    busy = node["state"] in BUSY or "COMPLETING" in node["flags"]
    if "NOT_RESPONDING" in node["flags"] or node["state"] in ("DOWN", "UNKNOWN", "FUTURE"):
        return "skip", "Slurm shows %s (%s): its slurmd does not answer, so whether a job runs is unknown" % (
            node["name"],
            "+".join([node["state"], *node["flags"]]),
        )
    if not node["drained"]:
        return "drain", ""
    if node["reason"] == reason:
        if busy:
            return "resume", "a job is still running on %s (DRAINING): resumed at once, skipped" % node[
                "name"
            ]
        return "run", "drained for this baseline, no job on it"
    if node["reason"].startswith("stethoscope: ") and not node["reason"].startswith(BASELINE_PREFIX):
        if busy:
            return "skip", "drained for remediation (%s) but a job still runs" % node["reason"]
        return "run", "drained for remediation (%s): measured, left drained for verify" % node["reason"]
    return "skip", "drained by someone else (%s): not touched" % (node["reason"] or "no reason")


def out_of_service(nodes):
    """Nodes Slurm already shows out of service (DRAIN, DOWN, not responding), baseline drains not
    counted: they are planned work, not isolations."""
    return sorted(
        n["name"]
        for n in nodes
        if (n["drained"] or n["state"] in ("DOWN", "UNKNOWN") or "NOT_RESPONDING" in n["flags"])
        and not n["reason"].startswith(BASELINE_PREFIX)
    )
