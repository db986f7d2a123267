"""`diagnose --execute`: findings become transactions and their actions run, each recorded.

A finding (rule, node, device) that is already open and inside its rule's cooldown keeps its
transaction and acts no more; a new one gets a transaction id, a `findings` row and, per action, an
`actions` row with start, end, status and detail. Open findings that no longer match are resolved.
The store is closed while playbooks run: their own callback writes to it (embedded: one process).
"""

from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.diagnosis.diagnose import action_label, printable, template_context
from stethoscope.diagnosis.rules import Action, parse_duration
from stethoscope.inventory import Inventory
from stethoscope.paths import default_spool_dir, project_root
from stethoscope.remediation.actions.http import send
from stethoscope.remediation.actions.playbook import run_playbook
from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.ledger import DRAIN, Ledger, action_row
from stethoscope.store.client import Store, StoreError
from stethoscope.store.spool import Spool
from stethoscope.templating import TemplateFailure, render
from stethoscope.timeutil import iso, now_ms


@dataclass
class Context:
    dsn: str
    database: str | None
    inventory: Inventory
    overrides: dict[str, Any] = field(default_factory=dict)
    state_dir: Path = field(default_factory=lambda: project_root() / ".stethoscope")
    spool_dir: Path = field(default_factory=default_spool_dir)

    def setting(self, name: str, default: Any = None) -> Any:
        return self.overrides.get(name, self.inventory.settings.get(name, default))

    @property
    def variables(self) -> dict[str, Any]:
        return {
            **self.inventory.settings,
            **self.inventory.settings.get("stethoscope_diagnose_vars", {}),
            **self.overrides,
        }


def new_txn_id() -> str:
    return uuid.uuid4().hex[:12]


class Executor:
    def __init__(self, context: Context):
        self.ctx = context
        window = parse_duration(context.setting("stethoscope_breaker_window", "1h")) or 3600
        self.breaker = CircuitBreaker(
            len(context.inventory.hosts), float(context.setting("stethoscope_breaker_fraction", 0.10)), window
        )
        self.log_path = Path(context.setting("stethoscope_diagnose_log", context.state_dir / "findings.log"))
        self.spooled = False

    def _store(self) -> Store:
        return Store(self.ctx.dsn, self.ctx.database)

    def run(
        self, findings: list[dict[str, Any]], evaluated_rules: set[str], at_ms: int
    ) -> list[dict[str, Any]]:
        acting: list[dict[str, Any]] = []
        with self._store() as store:
            self._replay_spool(store)
            ledger = Ledger(store)
            previous = ledger.open_findings()
            self.breaker.drained = ledger.drained_nodes_since(at_ms - self.breaker.window_seconds * 1000)
            seen, rows = set(), []
            for finding in findings:
                seen.add(finding["finding_id"])
                known = previous.get(finding["finding_id"])
                version = max(now_ms(), known.version + 1 if known else 0)
                if known and at_ms - known.txn_started_ms < finding["cooldown_seconds"] * 1000:
                    finding.update(txn_id=known.txn_id, first_seen_ms=known.txn_started_ms)
                    finding["outcome"] = (
                        f"cooldown: acted at {iso(known.txn_started_ms)} under txn {known.txn_id}"
                    )
                else:
                    finding.update(txn_id=new_txn_id(), first_seen_ms=at_ms, outcome="")
                    acting.append(finding)
                finding["first_seen"] = iso(finding["first_seen_ms"])
                rows.append((finding, "open", version, at_ms))
            ledger.write_findings(rows)
            hosts = self.ctx.inventory.hosts
            for finding_id, known in previous.items():
                evaluated = known.rule_id in evaluated_rules or known.rule_id.startswith("unknown.")
                # only this inventory's nodes were evaluated: another inventory's findings stay open
                ours = any(node in hosts for node in known.nodes)
                if finding_id not in seen and evaluated and ours:
                    ledger.resolve(finding_id, max(now_ms(), known.version + 1))
        for finding in acting:
            results = [self._act(finding, action) for action in finding["plan"]]
            finding["outcome"] = ", ".join(f"{label} {status}" for label, status in results)
        return findings

    def _replay_spool(self, store: Store) -> None:
        """Actions a previous run could not record; a spool that cannot be replayed never stops acting."""
        try:
            report = Spool(self.ctx.spool_dir).replay(store)
        except StoreError:
            raise
        except Exception as exc:
            print(f"stethoscope: spool {self.ctx.spool_dir} not replayed: {exc}", file=sys.stderr)
            return
        for problem in report.problems:
            print(f"stethoscope: spool: {problem}", file=sys.stderr)

    def _record(self, row: dict[str, Any]) -> None:
        """Into `actions`; if the store cannot take it now, into the spool (replayed on the next run)."""
        version = now_ms()
        try:
            with self._store() as store:
                Ledger(store).write_action(row, version)
        except StoreError as exc:
            Spool(self.ctx.spool_dir, self.ctx.dsn, self.ctx.database).append(
                "actions", [action_row(row, version)]
            )
            if not self.spooled:
                print(f"stethoscope: actions spooled, the store is unavailable: {exc}", file=sys.stderr)
            self.spooled = True

    def _act(self, finding: dict[str, Any], action: Action) -> tuple[str, str]:
        label = action_label(action)
        started = now_ms()
        row = {
            "txn_id": finding["txn_id"],
            "finding_id": finding["finding_id"],
            "action": label,
            "target": finding["node_id"],
            "status": "running",
            "detail": "",
            "started_at": started,
            "finished_at": None,
        }
        try:
            if action.type == "playbook":
                self._record(row)  # a playbook takes a while: its start is on record before it runs
            status, target, detail = self._dispatch(finding, action)
        except TemplateFailure as exc:
            status, target, detail = "failed", row["target"], {"error": str(exc)}
        except Exception as exc:  # one action's failure is recorded; the finding's other actions still run
            status, target, detail = "failed", row["target"], {"error": f"{type(exc).__name__}: {exc}"}
        row.update(status=status, target=target, detail=detail, finished_at=now_ms())
        self._record(row)
        return label, status

    def _dispatch(self, finding: dict[str, Any], action: Action) -> tuple[str, str, Any]:
        params = dict(action.params)
        context = template_context(finding, finding["txn_id"], self.ctx.variables)
        if action.type == "playbook":
            return self._playbook(finding, params["playbook"], params.get("extra_vars") or {})
        if action.type == "api_call":
            return self._api_call(finding, params, context)
        message = render(params.get("message") or finding.get("rule_message") or finding["message"], context)
        if action.type == "alert":
            return self._alert(finding, params, context, message)
        entry = {"at": iso(now_ms()), "txn_id": finding["txn_id"], **printable(finding), "message": message}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(json.dumps(entry, sort_keys=True) + "\n")
        return "ok", str(self.log_path), {"message": message}

    def _api_call(self, finding: dict[str, Any], params: dict[str, Any], context: dict[str, Any]):
        endpoint = render(params["endpoint"], context)
        payload = render(params["payload"], context) if "payload" in params else None
        headers = {k: render(str(v), context) for k, v in (params.get("headers") or {}).items()}
        result = send(
            endpoint,
            payload.encode() if payload is not None else None,
            method=str(params.get("method", "POST")).upper(),
            idempotency_key=finding["txn_id"],
            headers=headers,
            timeout=float(params.get("timeout", 10)),
            retries=int(params.get("retries", 3)),
        )
        detail = {"http_status": result.status, "attempts": result.attempts, "response": result.detail}
        return ("ok" if result.ok else "failed"), endpoint, detail

    def _alert(self, finding: dict[str, Any], params: dict[str, Any], context: dict[str, Any], message: str):
        endpoint_template = params.get("endpoint") or self.ctx.setting("stethoscope_alert_webhook")
        if not endpoint_template:
            return (
                "skipped",
                "",
                {"message": message, "reason": "no webhook configured (stethoscope_alert_webhook)"},
            )
        endpoint = render(str(endpoint_template), context)
        body = {"text": message, "txn_id": finding["txn_id"], "finding": printable(finding)}
        result = send(
            endpoint,
            json.dumps(body, sort_keys=True).encode(),
            idempotency_key=finding["txn_id"],
            timeout=float(self.ctx.setting("stethoscope_http_timeout", 10)),
            retries=int(self.ctx.setting("stethoscope_http_retries", 3)),
        )
        detail = {"message": message, "http_status": result.status, "attempts": result.attempts}
        return ("ok" if result.ok else "failed"), endpoint, detail

    def _playbook(self, finding: dict[str, Any], name: str, extra: dict[str, Any]) -> tuple[str, str, Any]:
        node = finding["node_id"]
        host = self.ctx.inventory.host(node)
        if host is None:
            return "skipped", node, {"reason": f"{node!r} is not a host of {self.ctx.inventory.path}"}
        if f"playbook:{name}" == DRAIN:
            allowed, why = self.breaker.permit(node)
            if not allowed:
                alert = self._alert(
                    finding, {}, template_context(finding, finding["txn_id"], self.ctx.variables), why
                )
                return "refused", node, {"reason": why, "alert": alert[0]}
        extravars = {
            **{k: v for k, v in extra.items()},
            **self.ctx.overrides,
            "stethoscope_txn_id": finding["txn_id"],
            "stethoscope_rule_id": finding["rule_id"],
            "stethoscope_finding": printable(finding),
            "stethoscope_remediate_execute": True,
        }
        envvars = {"STETHOSCOPE_DSN": self.ctx.dsn}
        if self.ctx.database:
            envvars["STETHOSCOPE_DATABASE"] = self.ctx.database
        result = run_playbook(name, self.ctx.inventory.path, node, extravars, envvars)
        if result.ok and f"playbook:{name}" == DRAIN:
            self.breaker.record(node)
        detail = {"rc": result.rc, "runner_status": result.status, "events": result.events}
        return ("ok" if result.ok else "failed"), node, detail
