"""The `silences` table: one row a silence and version (ReplacingMergeTree on version); expiring
one writes a new version ending now. Reads take the latest version of each. And their use in a
cycle: the findings they and Slurm's maintenance reservations silence, marked."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stethoscope.remediation import alertmanager
from stethoscope.remediation.silences import Matcher, Silence, mark_silenced, silencing
from stethoscope.remediation.slurm_reservations import read_maintenance
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

TABLE = "silences"
READ_KEY = "alertmanager silences"  # the cycle's read, in its context's read_once
log = logging.getLogger(__name__)


def has_table(store: Store) -> bool:
    """Whether the database has the table (one `db init` created before silences existed has not)."""
    rows = store.query(
        "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {t:String}",
        {"db": store.database, "t": TABLE},
    )
    return bool(rows and rows[0][0])


def add_silence(
    store: Store, matchers: tuple[Matcher, ...], seconds: int, created_by: str, reason: str
) -> Silence:
    now = now_ms()
    made = Silence(uuid.uuid4().hex[:12], matchers, now, now + seconds * 1000, created_by, reason, now)
    _write(store, made)
    return made


def expire_silence(store: Store, silence: Silence) -> Silence:
    """The silence again, ending now (a new version)."""
    now = now_ms()
    ended = Silence(
        silence.silence_id,
        silence.matchers,
        min(silence.starts_ms, now),
        now,
        silence.created_by,
        silence.reason,
        max(now, silence.version + 1),
    )
    _write(store, ended)
    return ended


def read_silences(store: Store, active_at_ms: int | None = None) -> list[Silence]:
    """Every silence's latest version (those active at `active_at_ms`, if given), newest first; none
    where the table does not exist yet."""
    if not has_table(store):
        return []
    rows = store.query(
        "SELECT silence_id, argMax(matchers, version), toUnixTimestamp64Milli(argMax(starts_at, version)), "
        "toUnixTimestamp64Milli(argMax(ends_at, version)), argMax(created_by, version), "
        f"argMax(reason, version), max(version) FROM {store.database}.{TABLE} GROUP BY silence_id "
        "ORDER BY 3 DESC, silence_id"
    )
    found = [
        Silence(row[0], _matchers(row[1]), int(row[2]), int(row[3]), row[4], row[5], int(row[6]))
        for row in rows
    ]
    return [s for s in found if active_at_ms is None or s.active(active_at_ms)]


def _matchers(text: str) -> tuple[Matcher, ...]:
    try:
        items = json.loads(text)
        return tuple(Matcher(str(i["key"]), str(i["op"]), str(i["value"])) for i in items)
    except (ValueError, TypeError, KeyError):
        return ()  # a row not of this shape matches nothing (Silence.matches needs a matcher)


def _write(store: Store, silence: Silence) -> None:
    matchers = [{"key": m.key, "op": m.op, "value": m.value} for m in silence.matchers]
    row = {
        "silence_id": silence.silence_id,
        "matchers": json.dumps(matchers, sort_keys=True),
        "starts_at": silence.starts_ms,
        "ends_at": silence.ends_ms,
        "created_by": silence.created_by,
        "reason": silence.reason,
        "version": silence.version,
    }
    store.insert_columns(f"{store.database}.{TABLE}", [[value] for value in row.values()], list(row))


def apply_silences(store: Store, findings: list[dict[str, Any]], context: Any = None) -> int:
    """Mark the findings an active silence or a Slurm maintenance reservation of their node matches
    (remediation.silences), now; how many. `context`: the executor's (its Slurm environment and the
    inventory's Slurm names), else Slurm is asked as this process is set up and names a node as the
    findings do."""
    if not findings:
        return 0
    at = now_ms()
    silences = read_silences(store, at) + alertmanager_silences(context)
    return mark_silenced(findings, silences, _maintenance(context), at)


def silencer(store: Store, context: Any = None) -> Callable[[dict[str, Any]], str | None]:
    """What silences a finding now (as apply_silences says), for findings that did not match this
    cycle (an open incident's held or stale ones): silences and Slurm are read at the first call."""
    read: list[tuple[list[Silence], dict[str, tuple[str, int]], int]] = []

    def silenced(finding: dict[str, Any]) -> str | None:
        if not read:
            at = now_ms()
            silences = read_silences(store, at) + alertmanager_silences(context)
            read.append((silences, _maintenance(context), at))
        silences, held, at = read[0]
        return silencing(finding, silences, held, at)

    return silenced


@dataclass(frozen=True)
class AlertmanagerRead:
    silences: list[Silence]
    unreadable: str = ""  # why its silences could not be read; "" when they were, or none is configured


def alertmanager_read(context: Any) -> AlertmanagerRead:
    """The active silences of the context's Alertmanager (`stethoscope_alertmanager_url`), respected
    as stethoscope's own; none without one. Read once a cycle: the context (one cycle's) keeps it."""
    url = context.setting(alertmanager.SETTING) if context is not None else None
    if not url:
        return AlertmanagerRead([])
    kept = getattr(context, "read_once", None)
    if kept is not None and READ_KEY in kept:
        return kept[READ_KEY]
    try:
        read = AlertmanagerRead(alertmanager.read_silences(str(url)))
    except OSError as exc:
        log.warning("silences: %s: drains are held this cycle (a silence there may hold their node)", exc)
        read = AlertmanagerRead([], str(exc))
    if kept is not None:
        kept[READ_KEY] = read
    return read


def alertmanager_silences(context: Any) -> list[Silence]:
    return alertmanager_read(context).silences


def drains_held(context: Any) -> str:
    """Why this cycle drains no node, "" when it may: fail closed, a drain waits while the silences a
    human may have set in Alertmanager cannot be read (the logs and alerts still run)."""
    why = alertmanager_read(context).unreadable
    return f"held: Alertmanager's silences could not be read this cycle ({why}); not draining" if why else ""


def _maintenance(context: Any) -> dict[str, tuple[str, int]]:
    """Inventory node -> (reservation, its end in ms): Slurm asked with the context's environment and
    its nodes' Slurm names; without a context, as this process is set up, a node named as Slurm does."""
    environment, names = {}, None
    if context is not None:
        environment, names = context.slurm_environment, context.slurm_names
    held = read_maintenance(environment) or {}
    if names is not None:
        held = {node: held[slurm] for node, slurm in names.items() if slurm in held}
    return held
