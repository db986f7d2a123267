"""One diagnosis cycle (what `diagnose` does once and `watch` repeats): evaluate, print, and with
--execute act on the findings. Executing, the cycle holds the database's executor lock from the
evaluation to the last record, and acts only if its heartbeat makes it the executor of record."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.diagnose import SEVERITY_ORDER, diagnose, printable, render
from stethoscope.diagnosis.model import ModelUse
from stethoscope.diagnosis.rules import Rule
from stethoscope.diagnosis.unknown import Fleet
from stethoscope.remediation.lock import ExecutorLock, Heartbeat, lock_path
from stethoscope.store.client import Store


def run_cycle(
    rules: list[Rule],
    catalog: Catalog,
    at_ms: int,
    *,
    dsn: str | None,
    database: str | None,
    as_json: bool,
    execute_with: Any = None,
    heartbeat: Heartbeat | None = None,
    nodes: Sequence[str] | None = None,
    fleet: Fleet | None = None,
    model: ModelUse | None = None,
) -> list[dict[str, Any]]:
    """`nodes`: the inventory's hosts, the only ones evaluated (and so acted on); None for all.
    `model`: the learned model's findings join the rules' (None: rules only, --no-model).
    Raises LockHeld when another run holds this database's executor lock (nothing done)."""
    executing = execute_with is not None
    standby = ""
    named = Store(dsn, database)  # the DSN and database as resolved (the lock is per database)
    context = execute_with(named.dsn, named.database) if executing else None
    lock = ExecutorLock(lock_path(context.spool_dir.parent, named.dsn, named.database)) if context else None
    one_shot = heartbeat is None
    if lock is not None:
        lock.acquire()
    try:
        with Store(dsn, database) as store:
            if context is not None:
                heartbeat = heartbeat or Heartbeat(float(context.setting("stethoscope_executor_beat", 60)))
                standby = heartbeat.beat(store)
            findings = diagnose(store, rules, at_ms, catalog, nodes, fleet, model)
        if context is not None and not standby:
            from stethoscope.remediation.executor import Executor

            evaluated = model.evaluated if model is not None and model.ran else None
            findings = Executor(context).run(findings, rules, at_ms, model_nodes=evaluated)
        if context is not None and one_shot and heartbeat is not None:
            with Store(dsn, database) as store:
                heartbeat.retire(store)
    finally:
        if lock is not None:
            lock.release()
    if standby:
        print(f"stethoscope: {standby}; this run does not act", file=sys.stderr)
    extra = ("txn_id", "outcome") if executing and not standby else ()
    if as_json:
        print(json.dumps([printable(f, extra) for f in findings], indent=1))
    else:
        name = model.describe() if model is not None else ""
        print(render(findings, len(rules), executed=executing and not standby, model=name))
    sys.stdout.flush()
    return findings


def worst(findings: list[dict[str, Any]]) -> int:
    return max((SEVERITY_ORDER[f["severity"]] for f in findings), default=-1)
