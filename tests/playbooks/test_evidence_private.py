"""An evidence bundle holds kernel logs and hardware records: on the controller it is 0600 in 0700
folders, and on the node it never lies readable by others while it is packed."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

from conftest import TOP, ansible_env

BIN = Path(sys.executable).parent


def test_an_evidence_bundle_is_0600_in_0700_folders(tmp_path, tmp_dsn):
    """Regression: the fetched `.tar.gz` was 0644 and its folders 0755."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("---\nall:\n  hosts:\n    node07: {ansible_connection: local}\n")
    evidence = tmp_path / "ev"
    variables = tmp_path / "vars.json"
    variables.write_text(
        json.dumps(
            {
                "stethoscope_txn_id": "abc123",
                "stethoscope_evidence_dir": str(evidence),
                "stethoscope_remediate_execute": True,
                "evidence_bundle_commands": [{"name": "kernel_log", "argv": ["echo", "kernel says hi"]}],
                "ansible_python_interpreter": sys.executable,
            }
        )
    )
    command = [
        str(BIN / "ansible-playbook"), "-i", str(inventory), str(TOP / "playbooks/remediate/evidence.yml"),
        "-e", f"@{variables}",
    ]  # fmt: skip
    play = subprocess.run(
        command, env=ansible_env(tmp_path, tmp_dsn), cwd=TOP, capture_output=True, text=True
    )
    assert play.returncode == 0, play.stdout[-3000:]
    bundle = evidence / "abc123" / "node07.tar.gz"
    assert bundle.is_file()
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600
    for folder in (evidence, evidence / "abc123"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


def test_the_tickets_copy_of_the_baseline_is_0600_in_0700_folders(tmp_path, tmp_dsn, http_standin):
    """Regression: the ticket role made the incident's folder 0755 and wrote the baseline
    comparison beside the evidence 0644."""
    hook = http_standin()
    evidence = tmp_path / "ev"
    variables = tmp_path / "vars.json"
    variables.write_text(
        json.dumps(
            {
                "stethoscope_txn_id": "abc123",
                "stethoscope_finding": {"rule_id": "r", "node_id": "node07", "device": "sda"},
                "stethoscope_evidence_dir": str(evidence),
                "stethoscope_remediate_execute": True,
                "stethoscope_ticket_backend": "webhook",
                "stethoscope_ticket_url": f"{hook.url}/tickets",
            }
        )
    )
    command = [
        str(BIN / "ansible-playbook"), "-i", str(TOP / "inventories/lab/hosts.yml"), "--limit", "node07",
        str(TOP / "playbooks/remediate/ticket.yml"), "-e", f"@{variables}",
    ]  # fmt: skip
    play = subprocess.run(
        command, env=ansible_env(tmp_path, tmp_dsn), cwd=TOP, capture_output=True, text=True
    )
    assert play.returncode == 0, play.stdout[-3000:]
    comparison = evidence / "abc123" / "node07-baseline.txt"
    assert comparison.is_file() and stat.S_IMODE(comparison.stat().st_mode) == 0o600
    for folder in (evidence, evidence / "abc123"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
