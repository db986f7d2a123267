"""One executor per database: a second `diagnose --execute` on this host exits 3 and does nothing while
another run holds the lock; across hosts the oldest live heartbeat acts and a host that missed 3 beats
is taken over."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

from test_execute import db, diagnose, execute_args, rules, table, worn

from stethoscope.remediation.lock import ExecutorLock, lock_path
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

from conftest import TOP

__all__ = ["db"]


def alerting(tmp_path, db, hook):
    with Store(db) as store:
        worn(store, "node03")
    rule_dir = rules(tmp_path, [{"type": "alert", "message": "worn"}])
    return rule_dir, [*execute_args(tmp_path, f"stethoscope_alert_webhook={hook.url}")]


def foreign_beat(db, beat_ms, host="controller-b.example", pid=4242):
    with Store(db) as store:
        store.insert_rows(
            "executors",
            [
                {
                    "host": host,
                    "pid": pid,
                    "started_at": now_ms() - 3600_000,
                    "beat_at": beat_ms,
                    "version": now_ms(),
                }
            ],
        )


def test_a_second_concurrent_execute_exits_3_and_does_nothing_while_the_lock_is_held(
    tmp_path, db, http_standin
):
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    spool = tmp_path / "spool"
    with Store(db) as named, ExecutorLock(lock_path(named.dsn, named.database)):
        command = [
            sys.executable, "-m", "stethoscope.cli", "--dsn", db, "--spool-dir", str(spool), "diagnose",
            "--rules", str(rule_dir), *settings,
        ]  # fmt: skip
        second = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
    assert second.returncode == 3, second.stderr
    assert "held by another run" in second.stderr and "Traceback" not in second.stderr
    assert hook.requests == [] and table(db, "SELECT count() FROM DB.findings") == [(0,)]


def test_a_live_foreign_heartbeat_keeps_this_host_from_acting(tmp_path, db, http_standin):
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    foreign_beat(db, now_ms() - 10_000)
    (finding,), result = diagnose(tmp_path, db, rule_dir, *settings)
    assert "standby: controller-b.example" in result.stderr and "txn_id" not in finding
    assert hook.requests == [] and table(db, "SELECT count() FROM DB.actions") == [(0,)]


def test_another_users_executor_on_this_host_keeps_this_one_from_acting(tmp_path, db, http_standin):
    """Regression: the lock folder is each user's own, and the heartbeat let any process of this host
    act ("the flock already decided"): `serve --execute` as its service user and `sudo stethoscope
    diagnose --execute` both acted on one server database."""
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    other = subprocess.Popen(["sleep", "120"])  # the other user's executor: a live process of this host
    try:
        foreign_beat(db, now_ms() - 10_000, host=socket.gethostname(), pid=other.pid)
        (finding,), result = diagnose(tmp_path, db, rule_dir, *settings)
    finally:
        other.kill()
        other.wait()
    assert f"standby: {socket.gethostname()} (pid {other.pid}" in result.stderr and "txn_id" not in finding
    assert hook.requests == [] and table(db, "SELECT count() FROM DB.actions") == [(0,)]


def test_a_fresh_heartbeat_of_a_process_of_this_host_that_is_gone_holds_no_one_back(
    tmp_path, db, http_standin
):
    """Regression: a serve killed with SIGKILL left a fresh beat; its successor, holding
    the flock the kernel freed, stood by for 3 beats (~3.5 minutes), logging `dry-run`."""
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    gone = subprocess.Popen(["true"])
    gone.wait()
    foreign_beat(db, now_ms() - 1_000, host=socket.gethostname(), pid=gone.pid)
    (finding,), result = diagnose(tmp_path, db, rule_dir, *settings)
    assert "standby" not in result.stderr and finding["outcome"] == "alert ok" and len(hook.requests) == 1


def test_a_foreign_heartbeat_that_missed_3_beats_is_taken_over(tmp_path, db, http_standin):
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    foreign_beat(db, now_ms() - 4 * 60_000)  # beats every 60 s by default
    (finding,), result = diagnose(tmp_path, db, rule_dir, *settings)
    assert "standby" not in result.stderr and finding["outcome"] == "alert ok" and len(hook.requests) == 1


def test_the_lock_belongs_to_the_database_whatever_spool_folder_a_run_is_given(tmp_path, db, http_standin):
    """Regression guard: the lock file lived beside the spool folder, so two runs with
    different --spool-dir both executed."""
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    with Store(db) as named, ExecutorLock(lock_path(named.dsn, named.database)):
        command = [
            sys.executable, "-m", "stethoscope.cli", "--dsn", db,
            "--spool-dir", str(tmp_path / "elsewhere" / "spool"),
            "diagnose", "--rules", str(rule_dir), *settings,
        ]  # fmt: skip
        second = subprocess.run(command, capture_output=True, text=True, cwd=TOP, check=False)
    assert second.returncode == 3, second.stderr
    assert "held by another run (pid" in second.stderr and "nothing done" in second.stderr
    assert hook.requests == []


def test_a_long_running_executor_holds_the_lock_between_its_cycles(tmp_path, db, http_standin):
    """watch --execute (as serve --execute) is the one executor of its database while it runs: a
    diagnose --execute between two of its cycles exits 3 and does nothing."""
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    with Store(db) as store:  # worn now: watch evaluates at the time it runs, not at test_execute's AT
        worn(store, "node03", at=now_ms())
    base = [sys.executable, "-m", "stethoscope.cli", "--dsn", db]
    watch = subprocess.Popen(
        [*base, "watch", "--rules", str(rule_dir), "--interval", "30", "--cycles", "2", "--json", *settings],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=TOP,
    )
    try:
        assert watch.stdout is not None and watch.stdout.readline().startswith("[")  # its first cycle ran
        second = subprocess.run(
            [*base, "diagnose", "--rules", str(rule_dir), *settings],
            capture_output=True,
            text=True,
            cwd=TOP,
            check=False,
        )
    finally:
        watch.kill()
        watch.wait()
    assert second.returncode == 3 and "watch" in second.stderr, second.stderr
    assert len(hook.requests) == 1  # the watch's one alert, nothing from the second run


def test_the_holder_is_named_by_its_program_never_by_its_arguments(tmp_path, db, http_standin):
    """Regression guard (review): the message printed the holder's whole command line, a DSN's
    password with it."""
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    with Store(db) as named:
        path = lock_path(named.dsn, named.database)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from stethoscope.remediation.lock import ExecutorLock;"
            "ExecutorLock(Path(sys.argv[1])).acquire(); print('held', flush=True); time.sleep(60)",
            str(path),
            "--dsn",
            "http://admin:s3cret-pw@db.example:8123/stethoscope",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        command = [sys.executable, "-m", "stethoscope.cli", "--dsn", db, "diagnose", "--rules", str(rule_dir)]
        second = subprocess.run([*command, *settings], capture_output=True, text=True, cwd=TOP, check=False)
    finally:
        holder.kill()
        holder.wait()
    assert second.returncode == 3 and f"(pid {holder.pid}: stethoscope in python -c)" in second.stderr
    assert "s3cret" not in second.stderr


def test_a_lock_folder_others_may_write_is_refused_and_left_as_it_is(tmp_path, db, http_standin):
    """Regression guard (review): the lock folder was made world-writable (1777) on every acquire,
    whatever folder STETHOSCOPE_LOCK_DIR named, and links in it were followed."""
    hook = http_standin()
    rule_dir, settings = alerting(tmp_path, db, hook)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    command = [sys.executable, "-m", "stethoscope.cli", "--dsn", db, "diagnose", "--rules", str(rule_dir)]
    env = {**os.environ, "STETHOSCOPE_LOCK_DIR": str(shared)}
    run = subprocess.run([*command, *settings], capture_output=True, text=True, cwd=TOP, check=False, env=env)
    assert run.returncode == 2 and "no one else may write" in run.stderr, run.stderr
    assert shared.stat().st_mode & 0o777 == 0o777 and hook.requests == []
    private = tmp_path / "private"
    env["STETHOSCOPE_LOCK_DIR"] = str(private)
    ours = subprocess.run(
        [*command, *settings], capture_output=True, text=True, cwd=TOP, check=False, env=env
    )
    assert ours.returncode in (0, 1), ours.stderr
    assert private.stat().st_mode & 0o777 == 0o700
    (lock,) = private.iterdir()
    assert lock.stat().st_mode & 0o777 == 0o600


def test_a_predecessor_with_this_process_pid_is_not_taken_for_this_executor():
    """Regression: executors were told apart by host and pid alone; a serve restarted in the same
    container (pid 1 again) took its predecessor's in-flight rows for its own, and its heartbeat as
    live. The owner also names the process's start."""
    from stethoscope.remediation.ledger import ActionState
    from stethoscope.remediation.reconcile import Orphans, owner

    me = owner()
    predecessor = {**me, "started": int(me["started"]) - 60_000}  # the same host and pid, earlier
    state = ActionState("txn1", "f1", "playbook:remediate/drain.yml", "node01", "in_flight",
                        {"executor": predecessor}, now_ms() - 1000, None, now_ms())  # fmt: skip
    orphans = Orphans({(me["host"], me["pid"], me["started"])}, lambda action: 3_600_000, busy=["txn1"])
    assert orphans.orphaned(state, now_ms())
    assert not orphans.orphaned(dataclasses.replace(state, detail={"executor": me}), now_ms())
