"""The lab Slurm's reset between tests (tools/slurm_lab.py undrain_all) holds when slurmctld is slow
to answer, as on a 2-core CI machine under the suite's load: a node listing or a RESUME that timed out
is not taken for done, which left a node drained for the next test (one drain reported `skipped`,
drained by someone else)."""

from __future__ import annotations

import os
import signal
import threading

import pytest
from slurm_lab import SlurmCluster, missing_tools

MESSAGE_TIMEOUT_S = 10  # Slurm's default MessageTimeout: scontrol gives up on a silent slurmctld after it


@pytest.fixture
def own_slurm(tmp_path):
    if missing := missing_tools():
        pytest.skip(f"Slurm is not installed here ({', '.join(missing)}): .ci/run installs it")
    cluster = SlurmCluster(tmp_path / "slurm").start()
    yield cluster
    cluster.stop()


def test_undrain_all_waits_out_a_slurmctld_that_answers_nothing_for_longer_than_scontrol_waits(own_slurm):
    own_slurm.scontrol("update", "NodeName=node01", "State=DRAIN", "Reason=stethoscope: earlier_test t1")
    ctld = int((own_slurm.root / "slurmctld.pid").read_text())
    os.kill(ctld, signal.SIGSTOP)  # scontrol's requests time out while it is stopped
    resumed = threading.Timer(MESSAGE_TIMEOUT_S + 3, os.kill, (ctld, signal.SIGCONT))
    resumed.start()
    try:
        own_slurm.undrain_all()
    finally:
        resumed.join()
    assert "DRAIN" not in own_slurm.node("node01")["state"], own_slurm.node("node01")


def test_a_reservation_a_test_left_is_gone_before_the_next_test(own_slurm):
    made = own_slurm.scontrol(
        "create", "reservation", "reservationname=left_behind", "flags=maint", "nodes=node03",
        "starttime=now", "duration=60", "user=root",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    own_slurm.clear_reservations()
    shown = own_slurm.scontrol("-o", "show", "reservation")
    assert shown.returncode == 0 and "left_behind" not in shown.stdout, shown
