"""`stethoscope watch`: cycles, a rule file edited between cycles is picked up, an invalid edit keeps
the last good version and says what is wrong with it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.ruleset import RuleSet

from conftest import TOP, hot_gpu

RULE = """
- rule_id: hot
  description: hot GPU (test)
  severity: warning
  trigger:
    - {{metric: gpu_temperature_celsius, operator: ">", threshold: {threshold}, window: 5m}}
"""


def write(path, threshold):
    path.write_text(textwrap.dedent(RULE.format(threshold=threshold)))
    time.sleep(0.01)  # a new mtime even on coarse clocks


def test_ruleset_reloads_changes_and_keeps_the_last_good_version(tmp_path):
    folder = tmp_path / "rules"
    folder.mkdir()
    write(folder / "hot.yml", 80)
    rules = RuleSet(folder, Catalog.load())
    assert rules.refresh() == [] and rules.rules[0].when.items[0].threshold == 80
    write(folder / "hot.yml", 70)
    assert rules.refresh() == [f"{folder / 'hot.yml'}: reloaded, 1 rules"]
    assert rules.rules[0].when.items[0].threshold == 70
    (folder / "hot.yml").write_text(
        (folder / "hot.yml").read_text().replace('operator: ">"', 'operator: "~"')
    )
    (message,) = rules.refresh()
    assert "hot.yml:6: operator:" in message and message.endswith("(keeping the last good version)")
    assert rules.rules[0].when.items[0].threshold == 70 and rules.refresh() == []  # reported once
    (folder / "hot.yml").unlink()
    assert rules.refresh() == [f"{folder / 'hot.yml'}: removed, its rules are dropped"] and rules.rules == []


def test_watch_runs_cycles_against_the_store(tmp_path, tmp_dsn):
    folder = tmp_path / "rules"
    folder.mkdir()
    write(folder / "hot.yml", 80)
    hot_gpu(tmp_dsn)
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "watch", "--rules", str(folder),
        "--interval", "0.2", "--cycles", "2",
    ]  # fmt: skip
    result = subprocess.run(command, cwd=TOP, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("1 findings from 1 rules (dry-run: no action taken)") == 2
    assert "node01" in result.stdout and "Traceback" not in result.stderr


def test_watch_survives_a_cycle_that_fails_outside_the_store_and_keeps_cycling(tmp_path, tmp_dsn):
    from test_execute import inventory

    folder = tmp_path / "rules"
    folder.mkdir()
    write(folder / "hot.yml", 80)
    hot_gpu(tmp_dsn)
    not_a_folder = tmp_path / "state"
    not_a_folder.write_text("a file where the lock folder should be\n")  # the disk, not the store
    command = [
        sys.executable, "-m", "stethoscope.cli", "--dsn", tmp_dsn, "--spool-dir", str(tmp_path / "spool"),
        "watch",
        "--rules", str(folder), "--interval", "0.2", "--cycles", "3", "--execute",
        "--inventory", str(inventory(tmp_path)), "-e", f"stethoscope_diagnose_log={tmp_path / 'log'}",
    ]  # fmt: skip
    env = {**os.environ, "STETHOSCOPE_LOCK_DIR": str(not_a_folder / "locks")}
    result = subprocess.run(
        command, cwd=TOP, capture_output=True, text=True, timeout=180, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    failures = [line for line in result.stderr.splitlines() if "watch: cycle" in line]
    assert [line.split(" failed")[0] for line in failures] == [
        f"stethoscope: watch: cycle {n}" for n in (1, 2, 3)
    ]
    assert "(3 so far)" in failures[-1] and "Traceback" not in result.stderr
