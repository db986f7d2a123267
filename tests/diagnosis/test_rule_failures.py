"""A rule that fails costs that rule only: one node's +Inf in a has_bits metric stops no
rule at all; a rule whose query fails is a `rule_failed` finding on the controller (its file:line and
the error) while the other rules' findings come as before; one-shot `diagnose` exits 3 only when
every rule failed; serve counts the failures per rule on /metrics and its cycles go on.

The failing rule is one `rules check` passes and ClickHouse refuses: its device glob holds a Unicode
hyphen (U+2010, as pasted from a web page), which the glob's regex escapes and RE2 cannot compile."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP


def at_ms() -> int:
    """The evaluation instant: now, give or take the seconds a test takes (an instant taken at import
    goes stale in a long suite, and serve evaluates at the time it runs)."""
    return now_ms() - 5_000


SECRET = b"rule-failure-secret-0123456789"

BITS = """
- rule_id: nvme_warning_bits
  description: an NVMe critical warning bit is set (test)
  severity: critical
  trigger:
    - {metric: nvme_critical_warning, operator: has_bits, threshold: 2, window: 5m, aggregate: last}
"""
HOT = """
- rule_id: gpu_hot
  description: a GPU runs hot (test)
  severity: critical
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 85, window: 5m, aggregate: last}
"""
PASTED = """
- rule_id: nvme_worn_pasted
  description: an NVMe drive is worn (test; its device glob was pasted with a Unicode hyphen)
  severity: warning
  trigger:
    - {metric: nvme_percentage_used, operator: ">", threshold: 90, window: 5m, aggregate: last,
       device: "nvme‐*"}
"""


# a message template that cannot render whatever the value: a division by zero
DIVIDES = """
- rule_id: gpu_warm_ratio
  description: a GPU runs warm (test; its message divides by zero)
  severity: warning
  message: "{{ node_id }} at {{ 100 / (value - value) }} %"
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 30, window: 5m, aggregate: last}
"""
NESTED = """
- rule_id: gpu_warm_loops
  description: a GPU runs warm (test; its message loops for hours)
  severity: warning
  message: "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
  trigger:
    - {metric: gpu_temperature_celsius, operator: ">", threshold: 30, window: 5m, aggregate: last}
"""
OVERFLOW = """
- rule_id: aer_burst
  description: correctable AER errors (test; the shipped message's `value | int`)
  severity: warning
  message: "{{ node_id }} {{ device }}: {{ value | int }} correctable errors"
  trigger:
    - {metric: pcie_aer_correctable_errors_total, operator: ">", threshold: 0, window: 10m,
       aggregate: delta}
"""


def rule_dir(tmp_path, **files: str):
    folder = tmp_path / "rules"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / f"{name}.yml").write_text(textwrap.dedent(text))
    return folder


def diagnose(dsn, rules, *extra):
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", dsn, "diagnose", "--json", "--no-model",
        "--rules", str(rules), "--at", str(at_ms() / 1000), *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)


def seed(dsn, *rows):
    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for node, metric, device, value in rows:
            batch.append(node, metric, device, {}, value, at_ms() - 1000)
        store.insert_metrics(batch)  # straight into the table: past every entry's checks


def test_one_nodes_inf_in_a_has_bits_metric_stops_no_rule(tmp_path, tmp_dsn):
    """Regression: one +Inf (a validly signed datagram did it) failed `has_bits` with "Unexpected inf
    or nan to integer conversion", and with it the whole cycle: every node's diagnosis lost."""
    seed(
        tmp_dsn,
        ("node01", "nvme_critical_warning", "nvme0", math.inf),
        ("node02", "nvme_critical_warning", "nvme0", 2.0),
        ("node03", "gpu_temperature_celsius", "gpu0", 95.0),
    )
    result = diagnose(tmp_dsn, rule_dir(tmp_path, bits=BITS, hot=HOT))
    assert result.returncode == 1, result.stderr
    found = sorted((f["rule_id"], f["node_id"]) for f in json.loads(result.stdout))
    assert found == [("gpu_hot", "node03"), ("nvme_warning_bits", "node02")]


def test_a_rule_whose_query_fails_is_a_rule_failed_finding_and_the_others_findings_come(tmp_path, tmp_dsn):
    seed(tmp_dsn, ("node03", "gpu_temperature_celsius", "gpu0", 95.0))
    rules = rule_dir(tmp_path, hot=HOT, pasted=PASTED)
    result = diagnose(tmp_dsn, rules)
    assert result.returncode == 1, result.stderr
    findings = {f["rule_id"]: f for f in json.loads(result.stdout)}
    assert set(findings) == {"gpu_hot", "rule_failed"}
    assert findings["gpu_hot"]["node_id"] == "node03"
    failed = findings["rule_failed"]
    assert (failed["node_id"], failed["device"], failed["severity"]) == (
        "controller",
        "nvme_worn_pasted",
        "warning",
    )
    assert f"{rules / 'pasted.yml'}:2" in failed["message"] and "nvme_worn_pasted" in failed["message"]
    assert "cannot compile re2" in json.loads(failed["evidence"])["error"]
    assert len(failed["message"]) <= 300 and set(failed["actions"]) <= {"log", "alert"}
    text = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "diagnose", "--no-model",
         "--rules", str(rules), "--at", str(at_ms() / 1000)],
        capture_output=True, text=True, cwd=TOP, check=False,
    )  # fmt: skip
    assert text.returncode == 1 and "rule_failed" in text.stdout and "Traceback" not in text.stderr


def test_an_executed_rule_failed_finding_resolves_once_the_rule_runs_again(tmp_path, tmp_dsn):
    """Under --execute with an inventory the controller is no host of it: its rule_failed finding
    must still resolve when the rule is mended, not stay open for ever."""
    seed(tmp_dsn, ("node03", "gpu_temperature_celsius", "gpu0", 95.0))
    rules = rule_dir(tmp_path, hot=HOT, pasted=PASTED)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("---\nall:\n  vars:\n    ansible_connection: local\n  hosts:\n    node03: {}\n")
    execute = [
        "--execute",
        "--inventory",
        str(inventory),
        "-e",
        f"stethoscope_diagnose_log={tmp_path / 'log'}",
    ]

    def status():
        with Store(tmp_dsn) as store:
            return store.query(
                f"SELECT argMax(status, version) FROM {store.database}.findings WHERE rule_id = 'rule_failed'"
            )[0][0]

    assert diagnose(tmp_dsn, rules, *execute).returncode == 1 and status() == "open"
    (rules / "pasted.yml").write_text(textwrap.dedent(PASTED).replace("nvme\u2010*", "nvme*"))
    mended = diagnose(tmp_dsn, rules, *execute)
    assert mended.returncode == 1, mended.stderr
    assert "rule_failed" not in mended.stdout and status() == "resolved"


def test_a_message_that_divides_by_zero_or_loops_costs_its_rule_only(tmp_path, tmp_dsn):
    """Regression: rendering a finding's message was outside the per-rule containment: a division by
    a zero value ended the cycle (exit 3), and nested loops held it for hours."""
    seed(tmp_dsn, ("node03", "gpu_temperature_celsius", "gpu0", 95.0))
    started = time.monotonic()
    result = diagnose(tmp_dsn, rule_dir(tmp_path, hot=HOT, divides=DIVIDES, nested=NESTED))
    assert time.monotonic() - started < 60
    assert result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)
    by_rule = {(f["rule_id"], f["device"]): f for f in findings}
    assert ("gpu_hot", "gpu0") in by_rule
    # each failing rule still names its node, with a plain message, and is told as a failure
    assert (
        by_rule[("gpu_warm_ratio", "gpu0")]["message"]
        == "node03 gpu0: a GPU runs warm (test; its message divides by zero)"
    )
    assert by_rule[("gpu_warm_loops", "gpu0")]["node_id"] == "node03"
    divided = json.loads(by_rule[("rule_failed", "gpu_warm_ratio")]["evidence"])
    assert divided["stage"] == "message" and "ZeroDivisionError" in divided["error"]
    looped = json.loads(by_rule[("rule_failed", "gpu_warm_loops")]["evidence"])
    assert looped["stage"] == "message" and "ran past" in looped["error"]


def test_a_counter_delta_past_any_float_is_told_per_series_and_costs_its_rule_nothing_else(tmp_path, tmp_dsn):
    """Regression: five finite rows of 1.7e308 (a counter reset between each) sum to a delta of inf;
    the shipped `{{ value | int }}` raised OverflowError and ended the cycle."""
    with Store(tmp_dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        start = at_ms() - 300_000
        for step, value in enumerate([1.7e308, 0.0, 1.7e308, 0.0, 1.7e308, 0.0, 1.7e308]):
            batch.append(
                "node01",
                "pcie_aer_correctable_errors_total",
                "0000:17:00.0",
                {},
                value,
                start + step * 30_000,
            )
        for step, value in enumerate([1200.0, 1204.0, 1209.0]):  # a counter starts where it stands
            batch.append(
                "node02",
                "pcie_aer_correctable_errors_total",
                "0000:17:00.0",
                {},
                value,
                start + step * 30_000,
            )
        batch.append("node03", "gpu_temperature_celsius", "gpu0", {}, 95.0, at_ms() - 1000)
        store.insert_metrics(batch)
    result = diagnose(tmp_dsn, rule_dir(tmp_path, hot=HOT, overflow=OVERFLOW))
    assert result.returncode == 1, result.stderr
    by_rule = {(f["rule_id"], f["node_id"]): f for f in json.loads(result.stdout)}
    assert ("gpu_hot", "node03") in by_rule
    assert by_rule[("aer_burst", "node02")]["message"] == "node02 0000:17:00.0: 9 correctable errors"
    assert ("aer_burst", "node01") not in by_rule
    told = json.loads(by_rule[("rule_failed", "controller")]["evidence"])
    assert told["stage"] == "aggregate" and "node01 0000:17:00.0" in told["error"] and "inf" in told["error"]


def test_diagnose_exits_3_only_when_every_rule_failed(tmp_path, tmp_dsn):
    seed(tmp_dsn, ("node03", "gpu_temperature_celsius", "gpu0", 40.0))
    result = diagnose(tmp_dsn, rule_dir(tmp_path, pasted=PASTED))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "every rule failed" in result.stderr and "nvme_worn_pasted" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_counts_rule_failures_on_metrics_and_its_cycles_go_on(tmp_path, tmp_dsn):
    seed(tmp_dsn, ("gpu-a", "gpu_temperature_celsius", "gpu0", 95.0))
    secret, inventory = tmp_path / "cluster.secret", tmp_path / "hosts.yml"
    secret.write_bytes(SECRET + b"\n")
    inventory.write_text("---\nall:\n  hosts:\n    gpu-a: {stethoscope_node_key: 1}\n")
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "serve", "--inventory", str(inventory), "--secret-file", str(secret), "--no-sweep", "--no-model",
        "--rules", str(rule_dir(tmp_path, hot=HOT, pasted=PASTED, divides=DIVIDES)),
        "--listen", "127.0.0.1:0",
        "--http", "127.0.0.1:0", "--interval", "1",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TOP)
    try:
        assert proc.stdout is not None
        head = proc.stdout.readline()
        match = re.search(r"http (http://[\d.]+:\d+)/healthz", head)
        assert match, head + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        deadline, metrics, health = time.time() + 90, "", {}
        while time.time() < deadline:
            with urllib.request.urlopen(f"{match[1]}/metrics", timeout=10) as response:
                metrics = response.read().decode()
            failures = re.search(
                r'stethoscope_rule_failures_total\{rule_id="nvme_worn_pasted"\} (\d+)', metrics
            )
            if failures and int(failures[1]) >= 2:
                with urllib.request.urlopen(f"{match[1]}/healthz", timeout=10) as response:
                    health = json.loads(response.read())
                break
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert failures and int(failures[1]) >= 2, metrics
    assert re.search(r'stethoscope_rule_failures_total\{rule_id="gpu_warm_ratio"\} [1-9]', metrics), metrics
    assert health["status"] == "ok" and health["cycle_failures"] == 0, health
    assert 'stethoscope_findings_open{node="gpu-a",rule_id="gpu_hot",severity="critical"} 1.0' in metrics
