"""The commands that only look (`diagnose` without --execute, its "dry-run: no action taken";
`summary`; `report`) write nothing to the store: run as an operator runs them, every table holds the
rows it held before. Only the cycles that record (serve, watch, --execute) write, the inventory's
new hosts among it.

A dry-run once inserted the inventory's hosts it had not seen into `nodes`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stethoscope.catalog import Catalog
from stethoscope.diagnosis.unknown import Fleet
from stethoscope.inventory import Host
from stethoscope.remediation.cycle import Cycles
from stethoscope.store.batch import MetricColumns
from stethoscope.store.client import Store
from stethoscope.timeutil import now_ms

STETHOSCOPE = Path(sys.executable).parent / "stethoscope"
MINUTE = 60_000
NODES = ("node01", "node02")


def cli(tmp_path: Path, dsn: str, *args: str) -> subprocess.CompletedProcess:
    """The stethoscope command as an operator runs it, its state kept under the test's folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STETHOSCOPE_")}
    env["STETHOSCOPE_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [str(STETHOSCOPE), "--dsn", dsn, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )


def row_counts(dsn: str) -> dict[str, int]:
    """database.table -> rows, of every table a command could have written (views hold none)."""
    with Store(dsn, None) as store:
        tables = store.query(
            "SELECT database, name FROM system.tables WHERE engine LIKE '%MergeTree%' "
            "AND database NOT IN ('system', 'information_schema', 'INFORMATION_SCHEMA')"
        )
        count = "SELECT count() FROM `{}`.`{}`"
        return {f"{db}.{name}": int(store.query(count.format(db, name))[0][0]) for db, name in tables}


@pytest.fixture
def stored(tmp_path: Path) -> str:
    """A fresh store with an hour of sweeps from node01 (one GPU too hot) and nothing from node02."""
    dsn = f"chdb://{tmp_path / 'db'}"
    at = now_ms()
    with Store(dsn, None) as store:
        store.init_schema()
        batch = MetricColumns()
        for minute in range(60, 0, -1):
            when = at - minute * MINUTE
            batch.append(NODES[0], "gpu_temperature_celsius", "gpu0", {}, 93.0, when)
            batch.append(NODES[0], "gpu_temperature_celsius", "gpu1", {}, 45.0, when)
            batch.append(NODES[0], "ib_port_state", "mlx5_0/1", {}, 4.0, when)
        store.insert_metrics(batch)
    return dsn


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    hosts = "".join(f"    {name}:\n      stethoscope_node_key: {i + 1}\n" for i, name in enumerate(NODES))
    path.write_text(f"all:\n  hosts:\n{hosts}")
    return path


@pytest.mark.parametrize(
    "command",
    [
        ("diagnose",),
        ("diagnose", "--json", "--no-model"),
        ("summary",),
        ("report",),
    ],
    ids=" ".join,
)
def test_a_command_that_only_looks_writes_nothing(tmp_path: Path, stored: str, inventory: Path, command):
    before = row_counts(stored)
    assert before[f"{Store(stored, None).database}.metrics"] == 180
    with_inventory = ("--inventory", str(inventory)) if command[0] != "report" else ()
    done = cli(tmp_path, stored, *command, *with_inventory)
    assert done.returncode in (0, 1), done.stderr  # 1: findings
    assert "Traceback" not in done.stderr
    assert row_counts(stored) == before


def test_a_watch_cycle_records_the_inventorys_new_hosts(stored: str) -> None:
    """The cycles that record (watch, serve, --execute) still give a host the store never saw its
    first sight, from which UNKNOWN's grace for a new host counts."""
    fleet = Fleet(tuple(Host(name, name, rack="r1", switch="leaf1") for name in NODES))
    with Store(stored, None) as store:
        watch = Cycles(store.dsn, store.database, Catalog.load(), fleet=fleet, long_running=True)
        watch.run([], now_ms(), store)
        recorded = store.query(f"SELECT node_id, rack, switch FROM {store.database}.nodes ORDER BY node_id")
    assert [tuple(row) for row in recorded] == [(name, "r1", "leaf1") for name in NODES]
