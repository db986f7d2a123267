"""Shared test set-up: the collection importable from the link farm, fixture paths, a temp store."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

TOP = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PUBLIC = FIXTURES / "public"
REAL = FIXTURES / "real" / "h200-vm"
COLLECTIONS = TOP / ".collections"

if not (COLLECTIONS / "ansible_collections/aicluster/stethoscope/galaxy.yml").exists():
    subprocess.run(["bash", str(TOP / "tools/link_collection.sh")], check=True, capture_output=True)
sys.path.insert(0, str(COLLECTIONS))


def fixture_text(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def tmp_dsn(tmp_path: Path) -> str:
    """An embedded ClickHouse of the test's own (a path no other process holds)."""
    return f"chdb://{tmp_path / 'db'}"


@pytest.fixture
def store(tmp_dsn: str):
    from stethoscope.store import Store

    with Store(tmp_dsn, f"t_{uuid.uuid4().hex[:8]}") as opened:
        opened.init_schema()
        yield opened


def ansible_env(tmp_path: Path, dsn: str | None = None, **extra: str) -> dict[str, str]:
    """Environment for a real ansible-playbook run against the project's config."""
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(TOP / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
        ANSIBLE_LOCAL_TEMP=str(tmp_path / "ansible-tmp"),
        ANSIBLE_HOME=str(tmp_path / "ansible-home"),
        STETHOSCOPE_SPOOL_DIR=str(tmp_path / "spool"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if dsn:
        env["STETHOSCOPE_DSN"] = dsn
    env.update(extra)
    return env


@contextlib.contextmanager
def database_held_elsewhere(path: Path):
    """Another process holds the embedded database at `path` open until the block ends."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from stethoscope.store import Store
            s = Store("chdb://{path}").open(); s.init_schema(); print("held", flush=True); time.sleep(120)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        holder.kill()
        holder.wait()
