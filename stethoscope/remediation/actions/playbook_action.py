"""The `playbook` action: a remediation playbook on the finding's node, through ansible-runner
(remediation.actions.playbook). A drain takes the circuit breaker's permit first (a refusal is
alerted once, at its first attempt) and gives it back when it did not isolate the node: it failed, it
had nothing to act with, or Slurm shows the node drained by someone else (not stethoscope's isolation)."""

from __future__ import annotations

import re
from typing import Any

from stethoscope.diagnosis.findings import printable
from stethoscope.priority import BACKGROUND_NICENESS
from stethoscope.remediation.actions.means import Act, Means, Result
from stethoscope.remediation.actions.notify import send_alert
from stethoscope.remediation.actions.playbook import playbook_environment, run_playbook
from stethoscope.remediation.ledger import DRAIN
from stethoscope.remediation.slurm_state import read_nodes

# a transaction id names a folder, a Slurm reason and a ticket label (verify.yml checks the same);
# a rule id as the rule loader takes it (model findings' ids hold '.')
TXN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
RULE_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def checked_id(name: str, value: Any, pattern: re.Pattern[str]) -> str:
    """A transaction or rule id as it may name a folder, a Slurm reason or a ticket label."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{name} {ascii(value)[:80]} is not an id of the form {pattern.pattern}")
    return value


def playbook(means: Means, act: Act) -> Result:
    finding, name = act.finding, act.params["playbook"]
    node = finding["node_id"]
    host = means.ctx.inventory.host(node)
    if host is None:
        return "skipped", node, {"reason": f"{node!r} is not a host of {means.ctx.inventory.path}"}
    draining = f"playbook:{name}" == DRAIN
    if draining:
        allowed, why = means.breaker.permit(node)
        if not allowed:
            if act.refused_before:  # refused again: its first refusal was alerted
                return "refused", node, {"reason": why, "alert": "alerted at the first refusal"}
            alerted = send_alert(means, Act(finding, {}, act.context), why)  # the webhook configured
            return "refused", node, {"reason": why, "alert": alerted[0]}
    extravars = {
        # the roles' default sits beside the playbooks, which an installed package holds read-only
        "stethoscope_evidence_dir": str(
            means.ctx.setting("stethoscope_evidence_dir", means.ctx.state_dir / "evidence")
        ),
        **dict(act.params.get("extra_vars") or {}),
        **means.ctx.overrides,
        "stethoscope_remediate_execute": True,
    }
    # the finding is the store's data, which a node wrote: never a template (a device named
    # `{{ lookup('pipe', ...) }}` would run on the controller), and ids only of their pattern
    untrusted = {
        "stethoscope_txn_id": checked_id("txn_id", finding["txn_id"], TXN_ID),
        "stethoscope_rule_id": checked_id("rule_id", finding["rule_id"], RULE_ID),
        "stethoscope_finding": printable(finding),
    }
    # the callback writes where this process reads, and spools where it replays (serve's spool);
    # an embedded database this process may hold is not waited for
    envvars = playbook_environment(means.ctx.dsn, means.ctx.database, means.ctx.spool_dir)
    try:
        result = run_playbook(
            name,
            means.ctx.inventory.path,
            node,
            extravars,
            envvars,
            means.playbook_timeout,
            untrusted,
            niceness=0 if draining else BACKGROUND_NICENESS,  # a node to isolate waits for nothing
        )
    except BaseException:
        if draining:
            means.breaker.release(node)
        raise
    if draining and (not result.ok or result.skipped):
        means.breaker.release(node)
    detail = {"rc": result.rc, "runner_status": result.status, "events": result.events}
    if result.skipped:  # the playbook had nothing to act with (its backend not configured)
        return "skipped", node, {"reason": result.skipped, **detail}
    other = drained_by_other(means, host.slurm_name, finding["txn_id"]) if draining and result.ok else None
    if other is not None:  # the drain left in place someone else's: not stethoscope's isolation
        means.breaker.release(node)
        return "skipped", node, {"reason": f"drained by someone else: {other}", **detail}
    return ("ok" if result.ok else "failed"), node, detail


def drained_by_other(means: Means, slurm_name: str, txn_id: str) -> str | None:
    """Slurm's reason when it shows the node drained for another reason than this txn's (a
    person's, another txn's, the gate's): the slurm_node module keeps it and reports ok. None
    when the drain is this txn's, or Slurm cannot be asked (the drain's own result stands)."""
    slurm = read_nodes(means.ctx.slurm_environment)
    node = slurm.get(slurm_name) if slurm else None
    if node is None or not node.out_of_service or txn_id in node.reason.split():
        return None
    return node.reason
