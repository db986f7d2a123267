"""Alertmanager as the sink of alerts: with `stethoscope_alertmanager_url`, the alert
action posts the finding to Alertmanager's v2 API (labels alertname = rule_id, node, device,
severity, level, txn; annotations message and evidence), serve's sink keeps the open findings firing
and sends endsAt for those that resolved, and a silence created in Alertmanager silences the
findings it matches as stethoscope's own silences do: no action. Against Debian's Alertmanager, run
for real on loopback."""

from __future__ import annotations

import http.server
import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
import yaml
from test_action_retries import cycle, start
from test_execute import db, execute_args, rules, table
from test_exporter_sources import DCGM, served

from stethoscope.remediation.alertmanager import AlertmanagerSink, labels_of
from stethoscope.timeutil import to_ms

from conftest import TOP

__all__ = ["db", "served"]  # the fixtures, shared with test_execute and test_exporter_sources

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
CONFIG = """\
route:
  receiver: nowhere
  group_wait: 1h
receivers:
  - name: nowhere
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(url: str, path: str, body=None):
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


@pytest.fixture
def alertmanager(tmp_path):
    """Debian's Alertmanager on loopback, no cluster, a route to a receiver that sends nothing."""
    if shutil.which(ALERTMANAGER) is None:
        pytest.skip(f"{ALERTMANAGER} is not installed (Debian's prometheus-alertmanager)")
    folder = tmp_path / "am"
    folder.mkdir()
    (folder / "am.yml").write_text(CONFIG)
    port = free_port()
    command = [
        ALERTMANAGER, f"--config.file={folder / 'am.yml'}", f"--storage.path={folder}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                raise
            time.sleep(0.2)
    try:
        yield url
    finally:
        process.terminate()
        process.wait(10)


def silence_node(url: str, node: str, comment: str = "PSU swap") -> str:
    now = time.time()
    body = {
        "matchers": [{"name": "node", "value": node, "isRegex": False, "isEqual": True}],
        "startsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 60)),
        "endsAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + 4 * 3600)),
        "createdBy": "alice",
        "comment": comment,
    }
    return api(url, "/api/v2/silences", body)["silenceID"]


def firing(url: str) -> list[dict]:
    return api(url, "/api/v2/alerts?active=true&silenced=true&inhibited=true&unprocessed=true")


def test_the_alert_action_reaches_alertmanager_with_the_findings_labels(tmp_path, db, alertmanager):
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn out"}])
    settings = execute_args(tmp_path, f"stethoscope_alertmanager_url={alertmanager}")
    finding = cycle(tmp_path, db, rule_dir, settings, start(), "node03")["node03"]
    assert finding["outcome"] == "alert ok", finding
    (alert,) = firing(alertmanager)
    assert alert["labels"] == {
        "alertname": "worn_ssd",
        "node": "node03",
        "device": "sda",
        "severity": "critical",
        "level": "L2",
        "txn": finding["txn_id"],
    }
    assert alert["annotations"]["message"] == "worn out"
    assert "smart_reallocated_sector_ct" in alert["annotations"]["evidence"]
    (status,) = table(db, "SELECT status FROM DB.actions FINAL WHERE action = 'alert'")[0]
    assert status == "ok"


def test_a_silence_created_in_alertmanager_stops_stethoscopes_action_for_that_node(
    tmp_path, db, alertmanager
):
    silence_id = silence_node(alertmanager, "node03")
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn out"}])
    settings = execute_args(tmp_path, f"stethoscope_alertmanager_url={alertmanager}")
    found = cycle(tmp_path, db, rule_dir, settings, start(), "node03", "node04")
    quiet, loud = found["node03"], found["node04"]
    assert quiet["silenced"] == f"alertmanager {silence_id}: PSU swap (alice)"
    assert quiet["outcome"] == f"silenced by alertmanager {silence_id}: PSU swap (alice): no action"
    assert loud["outcome"] == "alert ok"
    assert [a["labels"]["node"] for a in firing(alertmanager)] == ["node04"]
    assert table(db, "SELECT action, target FROM DB.actions FINAL") == [("alert", "node04")]


def test_the_sink_keeps_open_findings_firing_and_resolves_the_ones_that_cleared(alertmanager):
    finding = {
        "finding_id": "f1", "rule_id": "gpu_hot", "node_id": "node01", "device": "gpu0",
        "severity": "warning", "level": "L2", "confidence": 1.0, "message": "gpu0 at 91 C",
        "evidence": "gpu_temperature_celsius=91", "first_seen": "2026-12-06T10:00:00.000+00:00",
        "txn_id": "t1", "actions": ["log", "alert"],
    }  # fmt: skip
    sink = AlertmanagerSink(alertmanager, interval=60)
    now = int(time.time() * 1000)
    sink.publish([finding], now)
    (alert,) = firing(alertmanager)
    assert alert["labels"] == labels_of(finding) and alert["annotations"]["message"] == "gpu0 at 91 C"
    assert alert["startsAt"].startswith("2026-12-06T10:00:00")
    sink.publish([], int(time.time() * 1000))  # cleared: sent with endsAt now, Alertmanager resolves it
    assert firing(alertmanager) == []
    assert sink.failures == 0


def test_an_alertmanager_that_does_not_answer_fails_the_action_naming_it(tmp_path, db):
    dead = f"http://127.0.0.1:{free_port()}"
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn out"}])
    settings = execute_args(tmp_path, f"stethoscope_alertmanager_url={dead}")
    finding = cycle(tmp_path, db, rule_dir, settings, start(), "node03")["node03"]
    assert finding["outcome"].startswith("alert failed"), finding
    ((status, detail),) = table(db, "SELECT status, detail FROM DB.actions FINAL WHERE action = 'alert'")
    assert status == "failed" and "Connection refused" in detail, detail


def refreshed_by_the_sink(alert: dict) -> bool:
    ends = to_ms(alert["endsAt"]) / 1000
    return alert["labels"]["alertname"] == "gpu_warm_test" and ends - time.time() < 60


def test_serve_execute_alerts_alertmanager_on_a_finding_from_a_scraped_exporter(
    tmp_path, tmp_dsn, alertmanager, served
):
    """The whole loop: dcgm-exporter's page scraped as a source -> the store -> a rule -> the alert
    action -> Alertmanager, and serve's sink keeping it firing there."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump({
            "all": {
                "vars": {"stethoscope_scrape_interval": 1, "stethoscope_alertmanager_url": alertmanager,
                         "stethoscope_diagnose_log": str(tmp_path / "findings.log")},
                "hosts": {"gpu-a": {"stethoscope_node_key": 1,
                                    "stethoscope_scrape": [{"url": served(DCGM), "exporter": "dcgm"}]}},
            }
        })
    )  # fmt: skip
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "warm.yml").write_text(
        "---\n- rule_id: gpu_warm_test\n  description: a T4 at 25 C (test)\n  severity: warning\n"
        "  level: L2\n  message: '{{ device }} at {{ value }} C'\n  trigger:\n"
        "    - {metric: gpu_temperature_celsius, operator: '>', threshold: 20, window: 3m, aggregate: last}\n"
    )
    secret = tmp_path / "cluster.secret"
    secret.write_bytes(b"alertmanager-test-secret-0123456789\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-sweep", "--no-model",
        "--rules", str(rules), "--execute", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
        "--interval", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    try:
        deadline = time.monotonic() + 90
        # the alert action posts it without endsAt (Alertmanager gives it its resolve_timeout, 5m);
        # the sink posts it again after each cycle, ending 4 intervals ahead
        while not (alerts := [a for a in firing(alertmanager) if refreshed_by_the_sink(a)]):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() else ""
            )
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    (alert,) = alerts
    assert {k: alert["labels"][k] for k in ("node", "device", "severity", "level")} == {
        "node": "gpu-a", "device": "gpu0", "severity": "warning", "level": "L2",
    }  # fmt: skip
    assert alert["annotations"]["message"] == "gpu0 at 25.0 C" and alert["labels"]["txn"]


class FlakyAlertmanager:
    """A stand-in for Alertmanager's POST /api/v2/alerts: answers 503 while `failing`, else 200; keeps
    the alerts it took."""

    def __init__(self):
        self.failing = False
        self.taken: list[list[dict]] = []
        self.silences_readable = True
        self.silence_reads = 0

    def __enter__(self) -> str:
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if stand_in.failing:
                    self.send_response(503)
                else:
                    stand_in.taken.append(body)
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):  # /api/v2/silences
                stand_in.silence_reads += 1
                body = b"[]" if stand_in.silences_readable else b""
                self.send_response(200 if stand_in.silences_readable else 503)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_resolution_alertmanager_did_not_take_is_sent_again_until_it_does():
    finding = {
        "finding_id": "f1", "rule_id": "gpu_hot", "node_id": "node01", "device": "gpu0",
        "severity": "warning", "level": "L2", "message": "gpu0 at 91 C", "actions": ["log", "alert"],
    }  # fmt: skip
    stand_in = FlakyAlertmanager()
    with stand_in as url:
        sink = AlertmanagerSink(url, interval=60, timeout=5)
        sink.publish([finding], 1_780_000_000_000)
        stand_in.failing = True
        sink.publish([], 1_780_000_060_000)  # cleared, and the POST of its resolution fails
        stand_in.failing = False
        sink.publish([], 1_780_000_120_000)
    assert sink.failures == 1 and len(stand_in.taken) == 2  # the open alert, then its resolution
    (resolved,) = stand_in.taken[-1]
    assert resolved["labels"] == labels_of(finding)
    assert to_ms(resolved["endsAt"]) == 1_780_000_120_000


def test_while_alertmanagers_silences_cannot_be_read_drains_are_held_and_the_alert_still_runs(tmp_path, db):
    """Fail closed: a silence a human set in Alertmanager for the node may be there, unseen; the drain
    waits (refused, with the reason) while the log and the alert run. Its silences are read once a cycle."""
    stand_in = FlakyAlertmanager()
    stand_in.silences_readable = False
    drain = {"type": "playbook", "playbook": "remediate/drain.yml"}
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn out"}, drain])
    with stand_in as url:
        settings = execute_args(tmp_path, f"stethoscope_alertmanager_url={url}")
        finding = cycle(tmp_path, db, rule_dir, settings, start(), "node03")["node03"]
    assert finding["outcome"] == "alert ok, playbook:remediate/drain.yml refused", finding
    ((status, detail),) = table(db, "SELECT status, detail FROM DB.actions FINAL WHERE action LIKE '%drain%'")
    assert status == "refused" and "Alertmanager" in json.loads(detail)["reason"], detail
    # the alert action's, and the drain's refusal, alerted as the breaker's are
    alerted = [a["annotations"]["message"] for alerts in stand_in.taken for a in alerts]
    assert alerted[0] == "worn out" and "Alertmanager's silences could not be read" in alerted[1], alerted
    assert stand_in.silence_reads == 1
