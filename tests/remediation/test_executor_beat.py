"""The executor's heartbeat period is the inventory's `stethoscope_executor_beat`, read once, and beats
on a timer of its own: an executor whose cycles are far apart (serve or watch on a long --interval)
keeps acting against a standby with short ones rather than be counted dead between its cycles."""

from __future__ import annotations

import time
from typing import Any

from stethoscope.catalog import Catalog
from stethoscope.remediation.cycle import Cycles
from stethoscope.remediation.lock import MISSED_BEATS, Heartbeat
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms


class Inventory:
    def __init__(self, **settings: Any):
        self.settings = settings

    def setting(self, name: str, default: Any = None) -> Any:
        return self.settings.get(name, default)


def test_an_executor_between_long_cycles_keeps_acting_against_a_standby_with_short_ones(
    tmp_path, monkeypatch, store
):
    monkeypatch.setenv("STETHOSCOPE_LOCK_DIR", str(tmp_path / "locks"))
    beat = 2  # seconds: room for a loaded CI machine, and still several beats without a cycle
    acting = Cycles(
        store.dsn,
        store.database,
        Catalog.load(),
        execute_with=lambda dsn, database: Inventory(stethoscope_executor_beat=f"{beat}s"),
        long_running=True,
    )
    try:
        assert acting.mode(store).startswith("executing")  # its first cycle; the next is an hour away
        standby = Heartbeat(beat, host="controller-b.example", pid=4242, started_ms=now_ms() + 1)
        time.sleep((MISSED_BEATS + 1.5) * beat)  # more than 3 of its beats without a cycle
        with Store(store.dsn, store.database) as other:
            verdict = standby.beat(other)
    finally:
        acting.close()
    assert verdict.startswith("standby:"), "the standby took over from a live executor"
