"""One diagnosis cycle (what `diagnose` does once and `watch` repeats): evaluate, print, and with
--execute act on the findings."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.diagnose import SEVERITY_ORDER, diagnose, printable, render
from stethoscope.diagnosis.rules import Rule
from stethoscope.diagnosis.unknown import Fleet
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
    nodes: Sequence[str] | None = None,
    fleet: Fleet | None = None,
) -> list[dict[str, Any]]:
    """`nodes`: the inventory's hosts, the only ones evaluated (and so acted on); None for all."""
    with Store(dsn, database) as store:
        findings = diagnose(store, rules, at_ms, catalog, nodes, fleet)
        resolved_dsn, resolved_db = store.dsn, store.database
    if execute_with is not None:
        from stethoscope.remediation.executor import Context, Executor

        context: Context = execute_with(resolved_dsn, resolved_db)
        findings = Executor(context).run(findings, {r.rule_id for r in rules}, at_ms)
    extra = ("txn_id", "outcome") if execute_with is not None else ()
    if as_json:
        print(json.dumps([printable(f, extra) for f in findings], indent=1))
    else:
        print(render(findings, len(rules), executed=execute_with is not None))
    sys.stdout.flush()
    return findings


def worst(findings: list[dict[str, Any]]) -> int:
    return max((SEVERITY_ORDER[f["severity"]] for f in findings), default=-1)
