"""The `findings` and `actions` tables: what was found, under which transaction, and every step taken.

Rows update by a higher `version` (ReplacingMergeTree); reads take the latest version per key, so the
state is exact before ClickHouse merges."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stethoscope.store.client import Store

DRAIN = "playbook:remediate/drain.yml"


@dataclass
class OpenFinding:
    finding_id: str
    txn_id: str
    txn_started_ms: int  # first_seen: when this transaction began (and acted)
    version: int
    rule_id: str
    nodes: tuple[str, ...] = ()  # its node, and for a switch or rack finding the nodes behind it


class Ledger:
    def __init__(self, store: Store):
        self.store = store
        self.db = store.database

    def open_findings(self) -> dict[str, OpenFinding]:
        rows = self.store.query(
            "SELECT finding_id, argMax(txn_id, version), "
            "toUnixTimestamp64Milli(argMax(first_seen, version)), max(version), argMax(rule_id, version), "
            "argMax(node_id, version), JSONExtract(argMax(evidence, version), 'nodes', 'Array(String)') "
            f"FROM {self.db}.findings GROUP BY finding_id HAVING argMax(status, version) = 'open'"
        )
        return {
            row[0]: OpenFinding(row[0], row[1], int(row[2]), int(row[3]), row[4], (row[5], *row[6]))
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

    def resolve(self, finding_id: str, version: int) -> None:
        """The finding's latest row again, with status resolved: it no longer matches."""
        columns = (
            "finding_id, txn_id, rule_id, node_id, device, severity, confidence, level, message, evidence, "
            "first_seen, last_seen"
        )
        self.store.command(
            f"INSERT INTO {self.db}.findings SELECT {columns}, 'resolved', {{v:UInt64}} "
            f"FROM {self.db}.findings WHERE finding_id = {{f:String}} ORDER BY version DESC LIMIT 1",
            {"v": version, "f": finding_id},
        )

    def write_action(self, row: dict[str, Any], version: int) -> None:
        self.store.insert_rows("actions", [action_row(row, version)])

    def _successful_drains(self, where: str, params: dict[str, Any]) -> list[tuple]:
        """(node, txn_id, started ms) of each drain whose latest status is ok, filtered by `where`."""
        return self.store.query(
            "SELECT target, txn_id, toUnixTimestamp64Milli(started) FROM (SELECT target, txn_id, "
            "argMax(status, version) AS status, min(started_at) AS started "
            f"FROM {self.db}.actions WHERE action = {{drain:String}} "
            "GROUP BY txn_id, finding_id, action, target) "
            f"WHERE status = 'ok' AND {where} ORDER BY started",
            {"drain": DRAIN, **params},
        )

    def drained_nodes_since(self, since_ms: int) -> set[str]:
        rows = self._successful_drains(
            "started >= fromUnixTimestamp64Milli({since:Int64}, 'UTC')", {"since": since_ms}
        )
        return {node for node, _txn, _started in rows}

    def drain_of(self, node_id: str, txn_id: str) -> int | None:
        """When stethoscope drained `node_id` under `txn_id` (ms); None if the actions hold no such drain."""
        rows = self._successful_drains(
            "target = {node:String} AND txn_id = {txn:String}", {"node": node_id, "txn": txn_id}
        )
        return int(rows[0][2]) if rows else None

    def rule_of_txn(self, txn_id: str) -> str:
        rows = self.store.query(
            f"SELECT any(rule_id) FROM {self.db}.findings WHERE txn_id = {{txn:String}}", {"txn": txn_id}
        )
        return rows[0][0] if rows else ""


def action_row(row: dict[str, Any], version: int) -> dict[str, Any]:
    """An `actions` row: its detail as JSON text, its version."""
    detail = row.get("detail")
    text = detail if isinstance(detail, str) else json.dumps(detail, sort_keys=True, default=str)
    return {**row, "detail": text, "version": version}
