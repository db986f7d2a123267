"""Shared test set-up: the collection importable from the link farm, fixture paths, a temp store."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest
from hypothesis import settings

# The property tests draw the same examples every run (a red CI is a finding, not luck); drawing new
# ones each run is a run of its own: HYPOTHESIS_PROFILE=explore make test-fast
settings.register_profile("suite", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

TOP = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PUBLIC = FIXTURES / "public"
REAL = FIXTURES / "real" / "h200-vm"
COLLECTIONS = TOP / ".collections"
LAB_INVENTORY = TOP / "inventories" / "lab" / "hosts.yml"

if not (COLLECTIONS / "ansible_collections/aicluster/stethoscope/galaxy.yml").exists():
    subprocess.run(["bash", str(TOP / "tools/link_collection.sh")], check=True, capture_output=True)
# executor locks of this session in a folder of its own, not the user's
os.environ.setdefault("STETHOSCOPE_LOCK_DIR", tempfile.mkdtemp(prefix="stethoscope-test-locks-"))
sys.path.insert(0, str(COLLECTIONS))
sys.path.insert(0, str(TOP / "tools"))  # slurm_lab: the real slurmctld the tests start


def _test_folders(tests: Path) -> list[Path]:
    modules = (p for p in tests.rglob("test_*.py") if "fixtures" not in p.relative_to(tests).parts)
    return sorted({module.parent for module in modules})


# tests/helpers (tiers, http_standin, model_graphs) and every folder of tests/ importable by name: a test
# module imports another's helpers (`from test_execute import db`) wherever the two live; names are unique
for folder in [*_test_folders(Path(__file__).resolve().parent), Path(__file__).resolve().parent / "helpers"]:
    sys.path.insert(0, str(folder))


def pytest_configure(config: pytest.Config) -> None:
    from tiers import TIERS

    for tier in TIERS:
        config.addinivalue_line(
            "markers", f"{tier}: a test tier (tests/helpers/tiers.py); `make test-fast` leaves it out"
        )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tiers import mark

    mark(items)


def fixture_text(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def tmp_dsn(tmp_path: Path) -> str:
    """An embedded ClickHouse of the test's own (a path no other process holds)."""
    return f"chdb://{tmp_path / 'db'}"


@pytest.fixture
def store(tmp_dsn: str):
    from stethoscope.store.client import Store

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
        # the lab, named as `make demo` names it: ansible.cfg names no inventory
        ANSIBLE_INVENTORY=str(LAB_INVENTORY),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if dsn:
        env["STETHOSCOPE_DSN"] = dsn
    env.update(extra)
    return env


def swept_lab(tmp_path: Path, dsn: str) -> dict[str, str]:
    """The lab built under tmp_path, its database initialised and swept three times by the real
    collect.yml, as `make demo` does (rules needing 3 samples can fire); returns the environment."""
    env = ansible_env(tmp_path, dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"))
    subprocess.run(
        [sys.executable, str(TOP / "tools/lab.py"), "build"], env=env, check=True, capture_output=True
    )
    cli = [sys.executable, "-m", "stethoscope.cli"]
    subprocess.run([*cli, "db", "init"], env=env, cwd=TOP, check=True, capture_output=True)
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    for _sweep in range(3):
        play = subprocess.run(
            [playbook, str(TOP / "playbooks/collect.yml")], env=env, cwd=TOP, capture_output=True, text=True
        )
        assert play.returncode == 0, play.stdout[-3000:]
    return env


@contextlib.contextmanager
def database_held_elsewhere(path: Path, seconds: float = 120):
    """Another process holds the embedded database at `path` open until the block ends (or `seconds`).

    Yields that process (its pid is the one the holder file names)."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import time
            from stethoscope.store.client import Store
            s = Store("chdb://{path}").open(); s.init_schema(); print("held", flush=True)
            time.sleep({seconds}); s.close()
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def fake_tools(bindir: Path, log: Path, tools: dict[str, dict[str, str] | str]) -> None:
    """tools: name -> {"args": fixture path, or shell code} (or one of them for any args)."""
    bindir.mkdir(parents=True, exist_ok=True)
    for name, cases in tools.items():
        if isinstance(cases, str):
            cases = {"*": cases}
        lines = ["#!/bin/sh", f'echo "{name}${{*:+ $*}}" >> "{log}"', 'case "$*" in']
        for args, output in cases.items():
            source = FIXTURES / output
            body = f'cat "{source}"' if source.is_file() else output
            pattern = "*" if args == "*" else f'"{args}"'
            lines.append(f"  {pattern}) {body};;")
        lines += ["esac", ""]
        (bindir / name).write_text("\n".join(lines))
        (bindir / name).chmod(0o755)


def run_module(tmp_path: Path, module: str, args: dict, bindir: Path, check: bool = False) -> dict:
    tree = tmp_path / "tree"
    env = ansible_env(
        tmp_path,
        PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
        ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree",
        ANSIBLE_CALLBACK_TREE_DIR=str(tree),
        ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
    )
    shutil.rmtree(tree, ignore_errors=True)
    command = [
        str(Path(sys.executable).parent / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-m",
        f"aicluster.stethoscope.{module}",
        "-a",
        json.dumps(args),
        "-e",
        f"ansible_python_interpreter={sys.executable}",
    ]
    if check:
        command.append("--check")
    command.append("-v")  # a skipped task's reason is printed with -v
    proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if not (tree / "localhost").is_file() and "skipping: [localhost]" in proc.stdout:
        # the tree callback writes nothing for a skipped task: the default output has its reason
        return {"skipped": True, "failed": False, "stdout": proc.stdout}
    assert (tree / "localhost").is_file(), proc.stdout + proc.stderr
    result = json.loads((tree / "localhost").read_text())
    result["failed"] = proc.returncode != 0  # the tree callback drops the key; ansible's exit code says it
    return result


@contextlib.contextmanager
def slurm_with_slurmd(folder: Path, slurmd: str, others: str):
    """slurmctld with the nodes `others` never responding and `slurmd` a real slurmd (IDLE); skips
    where Slurm is missing. Jobs left behind are cancelled before it stops."""
    from slurm_lab import WITH_SLURMD, SlurmCluster, missing_tools

    missing = missing_tools() + missing_tools(WITH_SLURMD)
    if missing:
        pytest.skip(f"Slurm with slurmd is not installed here ({', '.join(missing)}): .ci/run installs it")
    cluster = SlurmCluster(folder, nodes=others, with_slurmd=slurmd).start()
    try:
        cluster.start_slurmd(slurmd)
        yield cluster
    finally:
        subprocess.run(["scancel", "--user", "root"], env={"SLURM_CONF": str(cluster.conf)}, check=False)
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_controller(tmp_path_factory):
    """A real slurmctld + munged (Debian packages; .ci/run installs them) with the lab's 8 nodes."""
    from slurm_lab import SlurmCluster, missing_tools

    missing = missing_tools()
    if missing:
        pytest.skip(
            f"Slurm is not installed here ({', '.join(missing)}): "
            "apt-get install slurmctld slurm-client munge (.ci/run does)"
        )
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def slurm(slurm_controller):
    """The session's Slurm controller, with no node drained and no reservation when the test starts."""
    slurm_controller.undrain_all()
    slurm_controller.clear_reservations()
    return slurm_controller


@pytest.fixture
def http_standin():
    """Start real loopback HTTP servers (Jira / webhook stand-ins); stopped after the test."""
    from http_standin import StandIn

    started: list[StandIn] = []

    def start(**options) -> StandIn:
        started.append(StandIn(**options).start())
        return started[-1]

    yield start
    for server in started:
        server.stop()


def hot_gpu(dsn: str, node: str = "node01") -> None:
    """A fresh database with `node`'s gpu0 at 85 C for the last two minutes (three sweeps)."""
    from stethoscope.store.batch import MetricColumns
    from stethoscope.store.client import Store
    from stethoscope.timeutil import now_ms

    with Store(dsn) as store:
        store.init_schema()
        batch = MetricColumns()
        for ago in (120_000, 60_000, 1_000):
            batch.append(node, "gpu_temperature_celsius", "gpu0", {}, 85.0, now_ms() - ago)
        store.insert_metrics(batch)


@pytest.fixture(scope="session")
def lab_sweeps(tmp_path_factory):
    """Three real sweeps of the lab (collect.yml, the callback, chdb), as the rows the collector stored
    each time; tests lay them out again at whatever cadence they need (`replay_sweeps`)."""
    from lab_sweeps import record

    return record(tmp_path_factory.mktemp("lab_sweeps"))


def replay_sweeps(store, lab_sweeps, times_ms: list[int], skip_nodes=()) -> None:
    from lab_sweeps import lay_out

    lay_out(store, lab_sweeps, times_ms, skip_nodes)


def approximately(matches: list[list]) -> list[list]:
    """Matches with their values to 12 significant digits: a slope or an average summed in another
    order (one read of several metrics, or of one) differs in its last bits."""

    def close(value: float) -> float:
        return float(f"{value:.12g}")

    return [
        [
            (m.node_id, m.device, close(m.value), {k: close(v) for k, v in m.values.items()}, m.nodes)
            for m in found
        ]
        for found in matches
    ]
