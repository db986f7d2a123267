"""Alertmanager, the sink such sites route alerts through (`stethoscope_alertmanager_url`): its v2 API.

- A finding is an alert with the labels alertname (its rule_id), node, device, severity, level and
  txn (the incident's transaction, where it has one), and the annotations message and evidence.
- The alert action posts it when the finding opens (remediation.actions.notify); serve's sink
  (AlertmanagerSink, after each cycle) posts every open finding again with an endsAt a few cycles
  ahead, as Prometheus does, and a finding that left the open ones with endsAt now: resolved.
- Silences are respected, not mirrored: an active silence created in Alertmanager (GET
  /api/v2/silences) whose matchers match a finding's labels silences it as stethoscope's own
  silences do (remediation.silences): no action, recorded `silenced`, saying which silence. A silence
  lives in one place, Alertmanager's, and ends there; a copy here could outlive it. Read once a
  cycle; a cycle that cannot read them drains no node (refused, saying why; logs and alerts run)."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import urllib3

from stethoscope.remediation.actions.http import HttpResult, send
from stethoscope.remediation.silences import Matcher, Silence
from stethoscope.store.dsn import redact
from stethoscope.timeutil import iso, to_ms

log = logging.getLogger(__name__)
SETTING = "stethoscope_alertmanager_url"
ALERTS = "/api/v2/alerts"
SILENCES = "/api/v2/silences"
RESEND_CYCLES = 4  # an open finding's endsAt: this many cycles ahead (Prometheus: 4 evaluation intervals)


def labels_of(finding: dict[str, Any]) -> dict[str, str]:
    """The alert's labels; empty ones left out (Alertmanager reads a missing label as empty)."""
    labels = {
        "alertname": finding.get("rule_id"),
        "node": finding.get("node_id"),
        "device": finding.get("device"),
        "severity": finding.get("severity"),
        "level": finding.get("level"),
        "txn": finding.get("txn_id"),
    }
    return {key: str(value) for key, value in labels.items() if value}


def alert_of(
    finding: dict[str, Any], message: str | None = None, ends_ms: int | None = None
) -> dict[str, Any]:
    evidence = finding.get("evidence", "")
    alert: dict[str, Any] = {
        "labels": labels_of(finding),
        "annotations": {
            "message": message if message is not None else str(finding.get("message", "")),
            "evidence": evidence if isinstance(evidence, str) else json.dumps(evidence, sort_keys=True),
        },
    }
    if finding.get("first_seen"):
        alert["startsAt"] = str(finding["first_seen"])
    if ends_ms is not None:
        alert["endsAt"] = iso(ends_ms)
    return alert


def post_alerts(
    url: str, alerts: list[dict[str, Any]], key: str, timeout: float = 10.0, retries: int = 3
) -> tuple[str, HttpResult]:
    """POST the alerts to Alertmanager at `url`: (the endpoint, how it went)."""
    endpoint = url.rstrip("/") + ALERTS
    body = json.dumps(alerts, sort_keys=True).encode()
    return endpoint, send(endpoint, body, idempotency_key=key, timeout=timeout, retries=retries)


@dataclass(frozen=True)
class LabelMatcher(Matcher):
    """One matcher of an Alertmanager silence, on the finding's alert labels: `=`, `!=`, `=~`, `!~`
    (regular expressions anchored, as Alertmanager's are)."""

    equal: bool = True

    def matches(self, finding: dict[str, Any]) -> bool:
        seen = labels_of(finding).get(self.key, "")
        if self.op == "=":
            hit = seen == self.value
        else:
            try:
                hit = re.fullmatch(self.value, seen) is not None
            except re.error:  # a pattern Python cannot read (RE2 only): matches nothing
                return False
        return hit == self.equal

    def __str__(self) -> str:
        return f"{self.key}{'' if self.equal else '!'}{self.op}{self.value}"


def read_silences(url: str, timeout: float = 10.0) -> list[Silence]:
    """Alertmanager's active silences as stethoscope's (silence_id `alertmanager <id>`); an answer
    that cannot be read is an OSError naming the URL (the cycle says it and holds its drains)."""
    endpoint = url.rstrip("/") + SILENCES
    try:
        with urllib3.PoolManager(timeout=urllib3.Timeout(total=timeout), retries=False) as pool:
            response = pool.request("GET", endpoint, headers={"Accept": "application/json"})
        if response.status != 200:
            raise OSError(f"HTTP {response.status}")
        items = json.loads(response.data)
    except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
        raise OSError(f"Alertmanager silences at {redact(endpoint)}: {exc}") from None
    return [s for s in (_silence(item) for item in items if isinstance(item, dict)) if s is not None]


def _silence(item: dict[str, Any]) -> Silence | None:
    if (item.get("status") or {}).get("state") != "active":
        return None
    try:
        matchers = tuple(
            LabelMatcher(
                str(m["name"]), "=~" if m.get("isRegex") else "=", str(m["value"]), m.get("isEqual", True)
            )
            for m in item.get("matchers") or []
        )
        starts, ends = to_ms(item["startsAt"]), to_ms(item["endsAt"])
    except (KeyError, TypeError, ValueError):
        return None  # a silence not of this shape silences nothing
    reason = f"{item.get('comment', '')} ({item.get('createdBy', '')})"
    return Silence(
        f"alertmanager {item.get('id', '')}", matchers, starts, ends, str(item.get("createdBy", "")), reason
    )


class AlertmanagerSink:
    """serve's, after each cycle: the open findings posted again (endsAt RESEND_CYCLES cycles ahead),
    those no longer open posted with endsAt now. What Alertmanager did not take is said and counted;
    the next cycle posts them again, the resolutions too (kept until a POST succeeds)."""

    def __init__(self, url: str, interval: float, timeout: float = 10.0):
        self.url, self.interval, self.timeout = url, interval, timeout
        self.failures = 0
        self._open: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._resolving: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}  # not taken yet

    def publish(self, findings: list[dict[str, Any]], at_ms: int) -> None:
        ahead = at_ms + int(RESEND_CYCLES * self.interval * 1000)
        now_open = {_key(f): f for f in findings if self._alerts(f)}
        cleared = {**self._resolving, **self._open}
        resolving = {key: f for key, f in cleared.items() if key not in now_open}
        alerts = [alert_of(f, ends_ms=ahead) for f in now_open.values()]
        alerts += [alert_of(f, ends_ms=at_ms) for f in resolving.values()]
        self._open = now_open
        if not alerts:
            return
        endpoint, result = post_alerts(
            self.url, alerts, key=f"cycle-{at_ms}", timeout=self.timeout, retries=1
        )
        # a resolution Alertmanager did not take is sent again with the next cycle's, until it does
        self._resolving = {} if result.ok else resolving
        if not result.ok:
            self.failures += 1
            log.warning(
                "alertmanager: %d alerts not taken by %s: %s", len(alerts), redact(endpoint), result.detail
            )

    def _alerts(self, finding: dict[str, Any]) -> bool:
        """An open finding that alerts (its actions have `alert`; one held open keeps alerting), unless a
        silence of stethoscope's holds it (one of Alertmanager's mutes it there: it stays posted)."""
        silenced = str(finding.get("silenced") or "")
        if silenced and not silenced.startswith("alertmanager "):
            return False
        return "alert" in (finding.get("actions") or []) or (
            bool(finding.get("held")) and _key(finding) in self._open
        )


def _key(finding: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels_of(finding).items()))


def sink_of(context: Any, interval: float) -> AlertmanagerSink | None:
    """serve's sink, for an executing serve whose settings name an Alertmanager; else None."""
    url = context.setting(SETTING) if context is not None else None
    return AlertmanagerSink(str(url), interval) if url else None
