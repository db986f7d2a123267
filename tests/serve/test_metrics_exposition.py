"""serve's /metrics behaves as an exporter: prometheus_client's own exposition (HEAD, gzip,
OpenMetrics when asked), process_* series and stethoscope_build_info, every label of a fixed set at 0
from the start (so `increase()` sees the first event), names per Prometheus' conventions (a timestamp
ends in `_timestamp_seconds`, no pre-computed rate), `promtool check metrics` clean, and a real
Prometheus (Debian's package) scrapes it on loopback."""

from __future__ import annotations

import gzip
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

import stethoscope
from stethoscope.catalog import default_catalog
from stethoscope.diagnosis.rules import load_rules
from stethoscope.paths import rules_dir
from stethoscope.remediation.cycle import CycleResult
from stethoscope.remediation.ledger import DRAIN, REBASELINE, VERIFY, Ledger
from stethoscope.remediation.rebaseline import outstanding, repaired_row
from stethoscope.serve import Server
from stethoscope.serve.exposition import Exposition
from stethoscope.serve.server import CycleState
from stethoscope.serve.sweeps import SweepStats
from stethoscope.telemetry import wire
from stethoscope.telemetry.keyring import Keyring
from stethoscope.telemetry.udp_collector import VALUE_REASONS, WRITE_ERROR_KINDS
from stethoscope.timeutil import now_ms

from conftest import TOP

SECRET = b"metrics-exposition-secret-0123456789"
PROMETHEUS, PROMTOOL = "/usr/bin/prometheus", "/usr/bin/promtool"
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """A real serve (no sweeps) on loopback, its first cycle done: yields (host, port)."""
    folder = tmp_path_factory.mktemp("serve")
    secret, inventory = folder / "cluster.secret", folder / "hosts.yml"
    secret.write_bytes(SECRET + b"\n")
    inventory.write_text("---\nall:\n  hosts:\n    gpu-a: {stethoscope_node_key: 1}\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", f"chdb://{folder / 'db'}",
        "--spool-dir", str(folder / "spool"), "serve", "--inventory", str(inventory),
        "--secret-file", str(secret), "--no-sweep", "--no-model",
        "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--interval", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline()
        match = re.search(r"http http://([\d.]+):(\d+)/healthz", head)
        assert match, head + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        address = (match[1], int(match[2]))
        deadline = time.time() + 120
        while json.loads(_get(address, "/healthz")[2])["cycles"] < 1 and time.time() < deadline:
            time.sleep(0.5)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _get(address, path: str, method: str = "GET", **headers: str) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(*address, timeout=10)
    try:
        connection.request(method, path, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def _metrics(address) -> str:
    status, _headers, body = _get(address, "/metrics")
    assert status == 200
    return body.decode()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_head_on_metrics_answers_200_with_its_headers_and_no_body(serve):
    """Regression: HEAD /metrics answered 501 (BaseHTTPRequestHandler has no do_HEAD)."""
    status, headers, body = _get(serve, "/metrics", method="HEAD")
    assert status == 200
    assert headers["content-type"] == TEXT_FORMAT
    assert body == b""
    assert int(headers["content-length"]) > 0  # what a GET would carry
    assert _get(serve, "/healthz", method="HEAD")[0] == 200


def test_metrics_are_gzipped_when_the_scraper_accepts_it(serve):
    """Regression: Accept-Encoding: gzip was ignored (Prometheus asks for it on every scrape)."""
    status, headers, body = _get(serve, "/metrics", **{"Accept-Encoding": "gzip"})
    assert status == 200 and headers.get("content-encoding") == "gzip"
    assert "stethoscope_cycles_total" in gzip.decompress(body).decode()
    assert "content-encoding" not in _get(serve, "/metrics")[1]  # only when asked


def test_metrics_are_openmetrics_when_asked(serve):
    """Regression: Accept: application/openmetrics-text got the 0.0.4 text format."""
    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    status, headers, body = _get(serve, "/metrics", Accept=accept)
    assert status == 200 and headers["content-type"].startswith("application/openmetrics-text")
    text = body.decode()
    assert text.endswith("# EOF\n")
    names = {family.name for family in openmetrics_families(text)}
    assert {"stethoscope_cycles", "stethoscope_build"} <= names


def test_process_series_and_build_info(serve):
    """Regression: serve's own registry had no process collector and no build information."""
    samples = _samples(_metrics(serve))
    names = {name for name, _labels in samples}
    process = {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds"}
    assert process <= names
    galaxy = yaml.safe_load((TOP / "collections/stethoscope/galaxy.yml").read_text())
    build = [(dict(labels), n) for (name, labels), n in samples.items() if name == "stethoscope_build_info"]
    assert build == [({"version": stethoscope.__version__, "collection": str(galaxy["version"])}, 1.0)]


def test_every_label_of_a_fixed_set_is_at_zero_before_its_first_event(serve):
    """Regression: labelled counters had no series until their first event, so `increase()` missed
    it: a fresh serve showed no stethoscope_telemetry_packets_rejected_total at all."""
    samples = _samples(_metrics(serve))

    def at_zero(name: str, label: str, values) -> None:
        for value in values:
            assert samples.get((name, ((label, value),))) == 0.0, f"{name}{{{label}={value!r}}} not at 0"

    at_zero("stethoscope_telemetry_packets_rejected_total", "reason", (*wire.REASONS, "internal"))
    at_zero("stethoscope_telemetry_values_rejected_total", "reason", VALUE_REASONS)
    at_zero("stethoscope_telemetry_write_errors_total", "kind", WRITE_ERROR_KINDS)
    shipped = load_rules(rules_dir(), default_catalog()).rules
    assert shipped
    at_zero("stethoscope_rule_failures_total", "rule_id", [rule.rule_id for rule in shipped])
    actions = [labels for name, labels in samples if name == "stethoscope_actions_total"]
    assert (("action", "drain"), ("outcome", "failed")) in actions
    at_zero("stethoscope_rebaselines", "state", ("waiting", "running", "needs_person"))
    at_zero("stethoscope_verifies", "state", ("due", "running"))


def test_no_precomputed_rate_is_exposed(serve):
    """Regression: stethoscope_store_rows_per_second was a rate computed by serve; the rows stored are
    a counter (stethoscope_telemetry_rows_total{outcome="stored"}) for Prometheus' rate()."""
    text = _metrics(serve)
    assert "per_second" not in text
    assert ("stethoscope_telemetry_rows_total", (("outcome", "stored"),)) in _samples(text)


def _stand_in(stats: SweepStats) -> SimpleNamespace:
    """What Exposition reads of serve's Server: its cycles' state, a sweeper's stats, no collector."""
    return SimpleNamespace(state=CycleState(), sweeper=SimpleNamespace(stats=stats), collector=None)


def test_the_last_sweep_is_a_timestamp_in_seconds_and_host_states_start_at_zero():
    """Regression: the last sweep's end, a unix time, was `stethoscope_sweep_last_finished_seconds`
    (a duration's name); the hosts of the last sweep had no series before the first sweep."""
    exposition = Exposition(_stand_in(SweepStats(ok=1, last_finished=1_750_000_000.5)))
    text = generate_latest(exposition.registry).decode()
    samples = _samples(text)
    assert samples[("stethoscope_sweep_last_finished_timestamp_seconds", ())] == 1_750_000_000.5
    assert "stethoscope_sweep_last_finished_seconds" not in text
    for state in ("ok", "failed", "unreachable"):
        assert samples[("stethoscope_sweep_hosts", (("state", state),))] == 0.0


def test_rebaselines_and_verifies_not_done_are_gauges_from_zero():
    """Regression: /metrics counted finished re-baselines and verifies only; one waiting for its
    window, running or left to a person, and a repaired incident waiting for its verify, had no series."""
    samples = _samples(generate_latest(Exposition(_stand_in(SweepStats())).registry).decode())
    for state in ("waiting", "running", "needs_person"):
        assert samples[("stethoscope_rebaselines", (("state", state),))] == 0.0
    for state in ("due", "running"):
        assert samples[("stethoscope_verifies", (("state", state),))] == 0.0


class _NothingFound:
    """serve's Cycles at its seam: a dry-run cycle that matched nothing."""

    execute_with = None

    def run(self, rules: list, at_ms: int, store=None) -> CycleResult:
        return CycleResult(at_ms=at_ms, findings=[], rules=len(rules), executing=False)


def test_a_cycle_publishes_the_rebaselines_waiting_and_the_verifies_due(store, tmp_path):
    now = now_ms()
    ledger = Ledger(store)
    waiting = {"txn_id": "rb-0123456789abcdef", "finding_id": "", "action": REBASELINE, "target": "node02",
               "status": "waiting", "detail": {"reason": "waiting for the window sat 02:00-06:00 (UTC)"},
               "started_at": now, "finished_at": None}  # fmt: skip
    before = now - 3600_000  # drained an hour ago
    drained = {"txn_id": "t-worn", "finding_id": "f-worn", "action": DRAIN, "target": "node01",
               "status": "ok", "detail": {}, "started_at": before, "finished_at": before}  # fmt: skip
    ledger.write_action(waiting, now)
    ledger.write_action(drained, before)
    ledger.write_action(repaired_row("t-worn", "node01", "a person", "GPU swapped"), now)
    server = Server(
        store=store,
        spool_dir=tmp_path / ".stethoscope" / "spool",
        keyring=Keyring({}, [b"s" * 32]),
        sets={},
        listen=("127.0.0.1", 0),
        http=None,
        interval=1,
        rules=list,
        catalog=default_catalog(),
        cycles=_NothingFound(),  # type: ignore[arg-type]
    )
    server.cycle()
    samples = _samples(server.exposition.answer(None, None).body.decode())
    rebaselines = {
        dict(k)["state"]: v for (name, k), v in samples.items() if name == "stethoscope_rebaselines"
    }
    verifies = {dict(k)["state"]: v for (name, k), v in samples.items() if name == "stethoscope_verifies"}
    assert rebaselines == {"waiting": 1.0, "running": 0.0, "needs_person": 0.0}
    assert verifies == {"due": 1.0, "running": 0.0}


def test_a_re_baseline_left_to_a_person_stops_counting_once_a_later_one_of_its_node_runs(store):
    """needs_person is a node's state, not a row's forever: the gauge an alert reads must go back to 0
    when the node is re-baselined again; a node whose last re-baseline was given up still counts."""
    now = now_ms()
    ledger = Ledger(store)

    def row(txn: str, node: str, status: str, at: int) -> dict:
        return {"txn_id": txn, "finding_id": "", "action": REBASELINE, "target": node, "status": status,
                "detail": {}, "started_at": at, "finished_at": at}  # fmt: skip

    ledger.write_action(row("rb-old3", "node03", "needs_person", now - 7200_000), now - 7200_000)
    ledger.write_action(row("rb-new3", "node03", "ok", now - 600_000), now - 600_000)
    ledger.write_action(row("rb-old4", "node04", "needs_person", now - 7200_000), now - 7200_000)
    assert outstanding(store).rebaselines == {"waiting": 0, "running": 0, "needs_person": 1}


def test_a_verify_whose_executor_died_and_whose_node_was_repaired_again_counts_once_as_due(store):
    """A verify left `running` by a killed executor, then a new repair of the node: the next cycle runs
    one verify, so the node counts once (due), not as due and running at once."""
    now = now_ms()
    ledger = Ledger(store)
    before = now - 3600_000
    drained = {"txn_id": "t-worn", "finding_id": "f-worn", "action": DRAIN, "target": "node01",
               "status": "ok", "detail": {}, "started_at": before, "finished_at": before}  # fmt: skip
    ledger.write_action(drained, before)
    ledger.write_action(repaired_row("t-worn", "node01", "a person", "GPU swapped"), before + 60_000)
    dead = {"txn_id": "t-worn", "finding_id": "", "action": VERIFY, "target": "node01", "status": "running",
            "detail": {"executor": {"host": "gone-host", "pid": 1, "started": 1}},
            "started_at": before + 120_000, "finished_at": None}  # fmt: skip
    ledger.write_action(dead, before + 120_000)
    ledger.write_action(repaired_row("t-worn", "node01", "a person", "GPU swapped again"), now - 60_000)
    assert outstanding(store).verifies == {"due": 1, "running": 0}


def _promtool() -> str:
    if not Path(PROMTOOL).is_file():
        pytest.skip(f"{PROMTOOL} absent: Debian's prometheus package is not installed")
    return PROMTOOL


def test_promtool_finds_nothing_wrong_with_a_real_serves_metrics(serve):
    promtool = _promtool()
    body = _metrics(serve).encode()
    check = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False
    )
    assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), check.stdout + check.stderr


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.loads(response.read())
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_a_real_prometheus_scrapes_serve(serve, tmp_path):
    if not Path(PROMETHEUS).is_file():
        pytest.skip(f"{PROMETHEUS} absent: Debian's prometheus package is not installed")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: stethoscope\n"
        f"    static_configs: [{{targets: ['{serve[0]}:{serve[1]}']}}]\n"
    )
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("wb")
    command = [
        PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    prometheus = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    up: list[dict] = []
    build: list[dict] = []
    try:
        deadline = time.time() + 90
        while time.time() < deadline and not (up and build):
            time.sleep(1)
            try:
                up = [r for r in _query(port, 'up{job="stethoscope"}') if r["value"][1] == "1"]
                build = _query(port, 'stethoscope_build_info{job="stethoscope"}') if up else []
            except OSError:  # not listening yet
                continue
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=60)
        log.close()
    assert up, (tmp_path / "prometheus.log").read_text()[-3000:]
    assert build and build[0]["metric"]["version"] == stethoscope.__version__, build
