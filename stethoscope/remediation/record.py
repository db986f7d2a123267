"""What a cycle records whether or not it acts: `serve` and `watch` keep the history of what
they found, and every cycle that recorded leaves a row in `evaluations`, so the board can tell a
healthy day from one nobody looked at. One-shot `diagnose` without --execute records nothing.

A dry-run cycle writes its findings with the life the executor gives them (remediation.life), but no
transaction: nothing acted, so `txn_id` is empty and the executor takes such a finding as new (it
opens an incident and acts). A finding matched now is `open`, or `silenced` when a silence covers it;
its first_seen is kept while it stays open; a held one stays open as it is; one of the dry run's own
that no longer matches becomes `resolved` when fresh data says so, `stale` when the data stopped.
A finding whose latest row has an executor's transaction, whatever its status, is the executor's:
the dry run writes nothing of it (a row of its own would drop a resolved finding's txn, and the
executor would take it as new: a second incident, ticket and drain past the flapping cooldown)."""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import Any

from stethoscope.diagnosis.findings import RULE_FAILED
from stethoscope.diagnosis.rules import Rule
from stethoscope.remediation.incident_view import Incident, listing_order
from stethoscope.remediation.ledger import KnownFinding, Ledger
from stethoscope.remediation.life import settle_silent
from stethoscope.remediation.silences import SILENCED
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

DRY_RUN, EXECUTE = "dry-run", "execute"

_schema_checked: set[tuple[str, str]] = set()  # (dsn, database): `evaluations` made sure of once


def record_dry_run(
    store: Store,
    findings: list[dict[str, Any]],
    rules: list[Rule],
    at_ms: int,
    hosts: Collection[str] | None = None,
    model_nodes: Collection[str] | None = None,
) -> None:
    """Write the life of this dry-run cycle's findings. `findings`: matched and held (`held`);
    `rules` fitted to the cadence; `hosts`: the inventory evaluated (another's findings are left
    alone); `model_nodes`: the nodes the model saw data of (None: it did not run)."""
    ledger = Ledger(store)
    known = ledger.known_findings()
    rows: list[tuple[dict[str, Any], str, int, int]] = []
    reopened: list[tuple[str, str, int]] = []
    for finding in findings:
        k = known.get(finding["finding_id"])
        if k is not None and k.txn_id:  # the executor's: it alone writes its life
            continue
        if finding.get("held"):  # open, as the table says, unless its data had stopped before
            if k is not None and k.status == "stale":
                reopened.append((k.finding_id, "open", _version(k)))
            continue
        ongoing = k is not None and k.status != "resolved"
        row = {
            **finding,
            "txn_id": "",
            "first_seen_ms": k.first_seen_ms if k is not None and ongoing else at_ms,
        }
        rows.append((row, SILENCED if finding.get("silenced") else "open", _version(k), at_ms))
    if rows:
        ledger.write_findings(rows)
    seen = {f["finding_id"] for f in findings}
    changes = reopened + _settled(store, known, seen, rules, at_ms, hosts, model_nodes)
    for finding_id, status, version in changes:
        ledger.set_status(finding_id, status, version)


def record_evaluation(
    store: Store, at_ms: int, mode: str, rules: int, nodes: Collection[str] | None, findings: int
) -> None:
    """That a cycle evaluated `nodes` (None: every node of the store) at `at_ms`."""
    key = (store.dsn, store.database)
    if key not in _schema_checked:
        store.ensure_schema()  # a database from before `evaluations`
        _schema_checked.add(key)
    store.insert_rows(
        "evaluations",
        [
            {
                "at": at_ms,
                "mode": mode,
                "rules": rules,
                "nodes": sorted(nodes) if nodes is not None else [],
                "findings": findings,
                "host": socket.gethostname(),
            }
        ],
    )


def _version(known: KnownFinding | None) -> int:
    return max(now_ms(), known.version + 1 if known else 0)


def _settled(
    store: Store,
    known: dict[str, KnownFinding],
    seen: set[str],
    rules: list[Rule],
    at_ms: int,
    hosts: Collection[str] | None,
    model_nodes: Collection[str] | None,
) -> list[tuple[str, str, int]]:
    """(finding_id, status, version) of the dry run's own findings (no transaction) that did not
    match now and are no longer open: resolved on fresh clear data, stale when the data stopped."""
    silent = [
        k
        for k in known.values()
        if not k.txn_id
        and k.status != "resolved"
        and k.finding_id not in seen
        and (hosts is None or k.rule_id == RULE_FAILED or any(node in hosts for node in k.nodes))
    ]
    return settle_silent(store, silent, rules, at_ms, model_nodes)[0]


def recorded_findings(
    store: Store, include_resolved: bool = False, node: str | None = None
) -> list[Incident]:
    """The findings a dry run recorded (no transaction), each shown as an incident of its own with an
    empty txn_id and the finding's status: what `incidents` lists besides the executor's."""
    found = [
        Incident(
            "",
            k.node_id,
            k.device,
            k.severity,
            [k.rule_id],
            k.first_seen_ms,
            k.last_seen_ms,
            k.status,
            [k],
        )
        for k in Ledger(store).known_findings().values()
        if not k.txn_id
        and (include_resolved or k.status != "resolved")
        and (node is None or k.node_id == node or node in k.nodes)
    ]
    found.sort(key=listing_order)
    return found
