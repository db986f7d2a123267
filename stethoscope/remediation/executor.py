"""`diagnose --execute`: findings become transactions and their actions run, each recorded.

What acts is decided by the finding's life (remediation/life.py): a new finding gets a transaction
id and runs its actions, one that stays open acts no more. Each action's intent is recorded
(`in_flight`) before it starts and its outcome, from ansible-runner's events, after. Independent
findings act in parallel (`stethoscope_executor_parallel`, default 4), one finding's steps in order.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stethoscope.diagnosis.diagnose import action_label, held_finding, printable, template_context
from stethoscope.diagnosis.rules import Action, Rule, parse_duration
from stethoscope.inventory import Inventory
from stethoscope.paths import default_spool_dir
from stethoscope.paths import state_dir as default_state_dir
from stethoscope.remediation.actions.http import send
from stethoscope.remediation.actions.playbook import run_playbook
from stethoscope.remediation.breaker import CircuitBreaker
from stethoscope.remediation.ledger import DRAIN, Drain, Ledger, action_row
from stethoscope.remediation.life import Decision, decide, new_txn_id
from stethoscope.remediation.slurm_state import read_nodes
from stethoscope.store.client import Store, StoreError
from stethoscope.store.dsn import redact
from stethoscope.store.spool import Spool
from stethoscope.templating import TemplateFailure, render
from stethoscope.timeutil import iso, now_ms

__all__ = ["Context", "Executor", "new_txn_id"]


@dataclass
class Context:
    dsn: str
    database: str | None
    inventory: Inventory
    overrides: dict[str, Any] = field(default_factory=dict)
    state_dir: Path = field(default_factory=default_state_dir)
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


class Executor:
    def __init__(self, context: Context):
        self.ctx = context
        fraction = float(context.setting("stethoscope_breaker_fraction", 0.10))
        self.breaker = CircuitBreaker(
            len(context.inventory.hosts),
            float(context.setting("stethoscope_breaker_isolated_fraction", fraction)),
            parse_duration(context.setting("stethoscope_breaker_window", "1h")) or 3600,
            float(context.setting("stethoscope_breaker_window_fraction", fraction)),
        )
        self.playbook_timeout = int(context.setting("stethoscope_playbook_timeout", 1800))
        self.parallel = max(1, int(context.setting("stethoscope_executor_parallel", 4)))
        self.log_path = Path(context.setting("stethoscope_diagnose_log", context.state_dir / "findings.log"))
        self.spooled = False
        self._records = threading.Lock()  # one store handle at a time in this process (embedded)

    def _store(self) -> Store:
        return Store(self.ctx.dsn, self.ctx.database)

    def run(
        self,
        findings: list[dict[str, Any]],
        rules: list[Rule],
        at_ms: int,
        model_nodes: Collection[str] | None = None,
    ) -> list[dict[str, Any]]:
        """The findings with what each did, and the findings held open though they did not match
        (diagnosis.hysteresis). `rules` as fitted to the cadence; `model_nodes`: the nodes the model
        evaluated this cycle (None: it did not run)."""
        with self._store() as store:
            self._replay_spool(store)
            ledger = Ledger(store)
            plan = decide(store, findings, rules, at_ms, self.ctx.inventory.hosts, model_nodes=model_nodes)
            ledger.write_findings(plan.rows)
            for finding_id, status, version in plan.changes:
                ledger.set_status(finding_id, status, version)
            if any(action_label(a) == DRAIN for d in plan.decisions for a in d.actions):
                self._arm_breaker(ledger)
        with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="finding") as pool:
            list(pool.map(self._act_all, plan.decisions))
        findings = [*findings, *(held_finding(held, rules) for held in plan.held)]
        if self.spooled:  # the store is free again: record now what had to wait
            try:
                with self._store() as store:
                    self._replay_spool(store)
            except StoreError:
                pass  # the next run replays it
        return findings

    def _replay_spool(self, store: Store) -> None:
        """Actions a previous run could not record; a spool that cannot be replayed never stops acting."""
        try:
            report = self._spool().replay(store)
        except StoreError:
            raise
        except Exception as exc:
            print(f"stethoscope: spool {self.ctx.spool_dir} not replayed: {exc}", file=sys.stderr)
            return
        for problem in report.problems:
            print(f"stethoscope: spool: {problem}", file=sys.stderr)

    def _spool(self) -> Spool:
        return Spool(self.ctx.spool_dir, self.ctx.dsn, self.ctx.database)

    def _arm_breaker(self, ledger: Ledger) -> None:
        """Who is out of service now and who was isolated within the window, from the actions
        table and, where it can be asked, Slurm; in-flight drains past their timeout expire."""
        hosts = self.ctx.inventory.hosts
        environment = self.ctx.setting("stethoscope_slurm_environment") or {}
        slurm = read_nodes({str(k): str(v) for k, v in dict(environment).items()})
        now = now_ms()
        held = set()
        for drain in ledger.drains():
            overdue = drain.status == "in_flight" and now - drain.started_ms > self.playbook_timeout * 1000
            if overdue and not self._expire(ledger, drain, slurm):
                continue
            held.add(drain.node)
        self.breaker.isolated = held
        self.breaker.recent = ledger.isolations_since(now - self.breaker.window_seconds * 1000)
        if slurm is None:
            self.breaker.slurm_note = "; Slurm could not be asked"
            return
        by_slurm_name = {host.slurm_name: name for name, host in hosts.items()}
        for slurm_name, node in slurm.items():
            if node.out_of_service and slurm_name in by_slurm_name:
                self.breaker.isolated.add(by_slurm_name[slurm_name])

    def _expire(self, ledger: Ledger, drain: Drain, slurm: dict[str, Any] | None) -> bool:
        """An in-flight drain whose executor died: in place if Slurm shows its reason, else expired."""
        host = self.ctx.inventory.hosts.get(drain.node)
        node = slurm.get(host.slurm_name if host else drain.node) if slurm else None
        in_place = node is not None and node.out_of_service and drain.txn_id in node.reason.split()
        reason = "Slurm shows its drain" if in_place else "Slurm shows no drain of its txn"
        if slurm is None:
            reason = "Slurm could not be asked"
        row = {
            "txn_id": drain.txn_id,
            "finding_id": drain.finding_id,
            "action": DRAIN,
            "target": drain.node,
            "status": "ok" if in_place else "expired",
            "detail": {"reason": f"in flight past its timeout ({self.playbook_timeout} s): {reason}"},
            "started_at": drain.started_ms,
            "finished_at": now_ms(),
        }
        ledger.write_action(row, now_ms())
        return in_place

    def _record(self, row: dict[str, Any]) -> None:
        """Into `actions`; if the store cannot take it now, into the spool (replayed after the run)."""
        with self._records:
            version = now_ms()
            try:
                with self._store() as store:
                    Ledger(store).write_action(row, version)
            except StoreError as exc:
                self._spool().append("actions", [action_row(row, version)])
                if not self.spooled:
                    print(f"stethoscope: actions spooled, the store is unavailable: {exc}", file=sys.stderr)
                self.spooled = True

    def _act_all(self, decision: Decision) -> None:
        finding = decision.finding
        results = []
        if decision.escalation is not None:
            escalation = decision.escalation
            now = now_ms()
            self._record(
                {
                    "txn_id": finding["txn_id"],
                    "finding_id": finding["finding_id"],
                    "action": "escalate",
                    "target": finding["node_id"],
                    "status": "ok",
                    "detail": {**escalation, "runs": [action_label(a) for a in decision.actions]},
                    "started_at": now,
                    "finished_at": now,
                }
            )
            results.append(
                f"escalated {escalation['from']} -> {escalation['to']} under txn {finding['txn_id']}"
            )
        results += [" ".join(self._act(finding, action)) for action in decision.actions]
        finding["outcome"] = ", ".join(results)

    def _act(self, finding: dict[str, Any], action: Action) -> tuple[str, str]:
        label = action_label(action)
        row = {
            "txn_id": finding["txn_id"],
            "finding_id": finding["finding_id"],
            "action": label,
            "target": finding["node_id"],
            "status": "in_flight",
            "detail": "",
            "started_at": now_ms(),
            "finished_at": None,
        }
        self._record(row)  # the intent is on record before the action starts
        try:
            status, target, detail = self._dispatch(finding, action)
        except TemplateFailure as exc:
            status, target, detail = "failed", row["target"], {"error": str(exc)}
        except Exception as exc:  # one action's failure is recorded; the finding's other actions still run
            status, target, detail = "failed", row["target"], {"error": f"{type(exc).__name__}: {exc}"}
        if target != row["target"]:  # the row's key stays the node; where the action went is detail
            detail = {
                **(detail if isinstance(detail, dict) else {"detail": detail}),
                "endpoint": redact(target),
            }
        row.update(status=status, detail=detail, finished_at=now_ms())
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
            # the roles' default sits beside the playbooks, which an installed package holds read-only
            "stethoscope_evidence_dir": str(
                self.ctx.setting("stethoscope_evidence_dir", self.ctx.state_dir / "evidence")
            ),
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
        draining = f"playbook:{name}" == DRAIN
        try:
            result = run_playbook(
                name, self.ctx.inventory.path, node, extravars, envvars, self.playbook_timeout
            )
        except BaseException:
            if draining:
                self.breaker.release(node)
            raise
        if draining and not result.ok:
            self.breaker.release(node)
        detail = {"rc": result.rc, "runner_status": result.status, "events": result.events}
        return ("ok" if result.ok else "failed"), node, detail
