"""The playbooks that run the stethoscope command on the controller (diagnose.yml, remediate/verify.yml,
the ticket role) read the database the operator's own `stethoscope` reads there: a module runs in a
temp folder, so without the operator's folder the command took the XDG state folder instead."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import TOP, ansible_env

PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def test_diagnose_yml_run_in_a_checkout_reads_that_checkouts_database(tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "collections" / "stethoscope").mkdir(parents=True)  # what makes a folder a checkout
    env = ansible_env(tmp_path, PWD=str(checkout), XDG_STATE_HOME=str(tmp_path / "xdg"), HOME=str(tmp_path))
    for name in ("STETHOSCOPE_HOME", "STETHOSCOPE_DSN", "STETHOSCOPE_SPOOL_DIR"):
        env.pop(name, None)
    init = subprocess.run(
        [sys.executable, "-m", "stethoscope.cli", "db", "init"],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
    )
    assert init.returncode == 0, init.stderr
    assert (checkout / ".stethoscope" / "db").is_dir()
    run = subprocess.run(
        [PLAYBOOK, "-i", str(TOP / "inventories/lab/hosts.yml"), str(TOP / "playbooks/diagnose.yml")],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "does not exist" not in run.stdout + run.stderr, run.stdout[-2000:]
    # the lab's hosts have no data in this store: UNKNOWN findings, which fail the play after evaluating
    assert run.returncode == 0 or "findings at or above critical" in run.stdout, run.stdout[-2000:]
    assert not (tmp_path / "xdg" / "stethoscope").exists()  # nothing written beside the checkout's
