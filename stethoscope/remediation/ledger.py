"""The `findings` and `actions` tables: what was found, under which transaction, and every step taken.

Rows update by a higher `version` (ReplacingMergeTree); reads take the latest version per key, so the
state is exact before ClickHouse merges."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from stethoscope.diagnosis.hysteresis import Previous
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

DRAIN = "playbook:remediate/drain.yml"
TICKET = "playbook:remediate/ticket.yml"  # the ticket action's label (diagnosis.levels' ticket)


RESUME = "resume"  # verify resumed the node: the drain of that txn ends, its findings resolve
# bookkeeping rows of an incident (finding_id empty, target the node), never retried
NEEDS_PERSON = "needs_person"  # an action failed past its last retry: alerted once
ACK = "ack"  # a person took the incident (`stethoscope incidents ack`)
ESCALATE = "escalate"  # a more severe finding joined the incident
# the circuit breaker refused a drain: kept as a row of its own, since the drain's row changes when
# the drain is tried again (`stethoscope breaker` and `actions --status refused` list these)
BREAKER_REFUSAL = "breaker_refusal"
# re-baselines and verifies the executor runs by itself (remediation.rebaseline): a person marked
# the incident repaired (`stethoscope incidents repaired`), then verify.yml ran for it
REPAIRED = "repaired"
VERIFY = "playbook:remediate/verify.yml"
REBASELINE = "rebaseline"  # under its own transaction (rb-…), one per node and fingerprint
BOOKKEEPING = (RESUME, NEEDS_PERSON, ACK, ESCALATE, BREAKER_REFUSAL, REPAIRED, VERIFY, REBASELINE)
HELD = ("ok", "in_flight")  # a drain in place, or one that may be
STATUSES = ("open", "stale", "resolved", "silenced")  # silenced: remediation.silences


@dataclass
class KnownFinding:
    finding_id: str
    txn_id: str
    first_seen_ms: int  # when its transaction began (and acted)
    last_seen_ms: int  # the last evaluation that matched it
    version: int
    rule_id: str
    node_id: str
    device: str
    severity: str
    status: str  # open | stale | resolved
    nodes: tuple[str, ...] = ()  # its node, and for a switch or rack finding the nodes behind it
    level: str = ""
    confidence: float = 1.0
    message: str = ""
    evidence: str = "{}"

    def previous(self) -> Previous:
        return Previous(
            self.finding_id,
            self.rule_id,
            self.node_id,
            self.device,
            self.severity,
            self.status,
            self.first_seen_ms,
            self.last_seen_ms,
            self.txn_id,
            self.level,
            self.confidence,
            self.message,
            self.evidence,
        )


@dataclass
class Drain:
    node: str
    txn_id: str
    finding_id: str
    status: str  # ok | in_flight
    started_ms: int


@dataclass
class ActionState:
    """An action's latest row: its current status, and in `detail` its attempts (remediation.retries)."""

    txn_id: str
    finding_id: str
    action: str
    target: str
    status: str
    detail: dict[str, Any]
    started_ms: int
    finished_ms: int | None
    version: int


class Ledger:
    def __init__(self, store: Store):
        self.store = store
        self.db = store.database

    def known_findings(self) -> dict[str, KnownFinding]:
        """Every finding's latest row, whatever its status."""
        rows = self.store.query(
            "SELECT finding_id, argMax(txn_id, version), "
            "toUnixTimestamp64Milli(argMax(first_seen, version)), "
            "toUnixTimestamp64Milli(argMax(last_seen, version)), max(version), argMax(rule_id, version), "
            "argMax(node_id, version), argMax(device, version), argMax(severity, version), "
            "argMax(status, version), JSONExtract(argMax(evidence, version), 'nodes', 'Array(String)'), "
            "argMax(level, version), argMax(confidence, version), argMax(message, version), "
            f"argMax(evidence, version) FROM {self.db}.findings GROUP BY finding_id"
        )
        return {
            row[0]: KnownFinding(
                *(row[0], row[1], int(row[2]), int(row[3]), int(row[4])),
                *(row[5], row[6], row[7], row[8], row[9]),
                nodes=(row[6], *row[10]),
                level=row[11],
                confidence=float(row[12]),
                message=row[13],
                evidence=row[14],
            )
            for row in rows
        }

    def write_findings(self, rows: list[tuple[dict[str, Any], str, int, int]]) -> None:
        """(finding, status, version, last_seen_ms) each, in one insert."""
        self.store.insert_rows(
            "findings",
            [
                {
                    "finding_id": finding["finding_id"],
                    "txn_id": finding["txn_id"],
                    "rule_id": finding["rule_id"],
                    "node_id": finding["node_id"],
                    "device": finding["device"],
                    "severity": finding["severity"],
                    "confidence": float(finding["confidence"]),
                    "level": finding["level"],
                    "message": finding["message"],
                    "evidence": finding["evidence"],
                    "first_seen": finding["first_seen_ms"],
                    "last_seen": last_seen_ms,
                    "status": status,
                    "version": version,
                }
                for finding, status, version, last_seen_ms in rows
            ],
        )

    def set_status(self, finding_id: str, status: str, version: int) -> None:
        """The finding's latest row again, with another status (open, stale, resolved)."""
        self._copy("finding_id = {f:String} ORDER BY version DESC LIMIT 1", status, version, finding_id)

    def resolve_txn(self, txn_id: str, version: int) -> None:
        """Every finding of the transaction resolved (verify resumed its node)."""
        self._copy(
            "(finding_id, version) IN (SELECT finding_id, max(version) FROM "
            f"{self.db}.findings GROUP BY finding_id HAVING argMax(txn_id, version) = {{f:String}})",
            "resolved",
            version,
            txn_id,
        )

    def _copy(self, where: str, status: str, version: int, key: str) -> None:
        columns = (
            "finding_id, txn_id, rule_id, node_id, device, severity, confidence, level, message, evidence, "
            "first_seen, last_seen"
        )
        self.store.command(
            f"INSERT INTO {self.db}.findings SELECT {columns}, {{s:String}}, {{v:UInt64}} "
            f"FROM {self.db}.findings WHERE {where}",
            {"s": status, "v": version, "f": key},
        )

    def write_action(self, row: dict[str, Any], version: int) -> None:
        self.store.insert_rows("actions", [action_row(row, version)])

    def action_states(
        self,
        txn_ids: Collection[str] | None = None,
        status: str | None = None,
        since_ms: int | None = None,
        actions: Collection[str] | None = None,
    ) -> list[ActionState]:
        """The latest row of every action (of these transactions, in this status, started since, of
        these actions), oldest first."""
        having = ["1"]
        params: dict[str, Any] = {}
        where = ["1"]
        if txn_ids is not None:
            where.append("txn_id IN {txns:Array(String)}")
            params["txns"] = sorted(set(txn_ids))
        if actions is not None:
            where.append("action IN {actions:Array(String)}")
            params["actions"] = sorted(set(actions))
        if status is not None:
            having.append("status = {status:String}")
            params["status"] = status
        if since_ms is not None:
            having.append("started >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')")
            params["since"] = since_ms
        rows = self.store.query(
            "SELECT txn_id, finding_id, action, target, argMax(status, version) AS status, "
            "argMax(detail, version), toUnixTimestamp64Milli(argMax(started_at, version) AS started), "
            "toUnixTimestamp64Milli(tupleElement(argMax(tuple(finished_at), version), 1)), max(version) "
            f"FROM {self.db}.actions WHERE {' AND '.join(where)} GROUP BY txn_id, finding_id, action, target "
            f"HAVING {' AND '.join(having)} ORDER BY started, txn_id, action",
            params,
        )
        return [
            ActionState(
                *(row[0], row[1], row[2], row[3], row[4], _detail(row[5])),
                int(row[6]),
                None if row[7] is None else int(row[7]),
                int(row[8]),
            )
            for row in rows
        ]

    def drains(self, where: str = "1", params: dict[str, Any] | None = None) -> list[Drain]:
        """Drains in place or under way (latest status ok or in_flight) and not resumed since."""
        rows = self.store.query(
            "SELECT target, txn_id, finding_id, status, toUnixTimestamp64Milli(started) FROM (SELECT "
            "target, txn_id, finding_id, argMax(status, version) AS status, "
            "argMax(started_at, version) AS started "
            f"FROM {self.db}.actions WHERE action = {{drain:String}} "
            "GROUP BY txn_id, finding_id, action, target) "
            "WHERE status IN {held:Array(String)} AND (txn_id, target) NOT IN (SELECT txn_id, target FROM "
            f"{self.db}.actions WHERE action = {{resume:String}}) AND {where} ORDER BY started",
            {"drain": DRAIN, "resume": RESUME, "held": list(HELD), **(params or {})},
        )
        return [Drain(row[0], row[1], row[2], row[3], int(row[4])) for row in rows]

    def isolations_since(self, since_ms: int) -> set[str]:
        """Nodes stethoscope drained (or began to) since `since_ms`, resumed or not."""
        rows = self.store.query(
            "SELECT DISTINCT target FROM (SELECT target, argMax(status, version) AS status, "
            f"argMax(started_at, version) AS started FROM {self.db}.actions WHERE action = {{drain:String}} "
            "GROUP BY txn_id, finding_id, action, target) WHERE status IN {held:Array(String)} "
            "AND started >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')",
            {"drain": DRAIN, "held": list(HELD), "since": since_ms},
        )
        return {row[0] for row in rows}

    def drained_txns(self) -> set[str]:
        """Transactions whose drain holds a node: their findings stay open until verify resumes it."""
        return {drain.txn_id for drain in self.drains()}

    def drain_of(self, node_id: str, txn_id: str) -> int | None:
        """When stethoscope drained `node_id` under `txn_id` (ms); None if the actions hold no such drain."""
        rows = self.store.query(
            "SELECT toUnixTimestamp64Milli(started) FROM (SELECT argMax(status, version) AS status, "
            f"argMax(started_at, version) AS started FROM {self.db}.actions WHERE action = {{drain:String}} "
            "AND target = {node:String} AND txn_id = {txn:String} GROUP BY finding_id) "
            "WHERE status = 'ok' ORDER BY started LIMIT 1",
            {"drain": DRAIN, "node": node_id, "txn": txn_id},
        )
        return int(rows[0][0]) if rows else None

    def rule_of_txn(self, txn_id: str) -> str:
        """The rule in the drain reason: that of the finding whose action drained (a family's txn has
        several rules), else any finding's of the txn."""
        rows = self.store.query(
            f"SELECT argMin(rule_id, drained = 0) FROM (SELECT rule_id, finding_id IN (SELECT finding_id "
            f"FROM {self.db}.actions WHERE txn_id = {{txn:String}} AND action = {{drain:String}}) AS drained "
            f"FROM {self.db}.findings WHERE txn_id = {{txn:String}})",
            {"txn": txn_id, "drain": DRAIN},
        )
        return rows[0][0] if rows else ""


def _detail(text: str) -> dict[str, Any]:
    try:
        detail = json.loads(text) if text else {}
    except ValueError:
        return {"detail": text}
    return detail if isinstance(detail, dict) else {"detail": detail}


def note_row(txn_id: str, action: str, target: str, detail: Any, finding_id: str = "") -> dict[str, Any]:
    """An `actions` row for something that happened at once (an escalation, an ack, a resume, a
    call for a person): status ok, started and finished now."""
    now = now_ms()
    return {
        "txn_id": txn_id,
        "finding_id": finding_id,
        "action": action,
        "target": target,
        "status": "ok",
        "detail": detail,
        "started_at": now,
        "finished_at": now,
    }


def action_row(row: dict[str, Any], version: int) -> dict[str, Any]:
    """An `actions` row: its detail as JSON text, its version."""
    detail = row.get("detail")
    text = detail if isinstance(detail, str) else json.dumps(detail, sort_keys=True, default=str)
    return {**row, "detail": text, "version": version}
