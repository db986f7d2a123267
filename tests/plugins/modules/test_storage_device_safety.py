"""The storage suite never writes a block device, however it is named (a symlink to /dev/nvme1n1 is
one), and never unlinks one; the preheat checks free space before it writes its file.

Every block device here is a node made with mknod on major 240 (local/experimental use, no driver:
opening it fails with ENXIO), or, not as root, one of /dev's, and fio is a stand-in that only logs:
a broken check writes nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.aicluster.stethoscope.plugins.module_utils.suite_storage import is_block_device

from conftest import TOP, ansible_env, fake_tools, run_module

BIN = Path(sys.executable).parent


@pytest.fixture
def block_device(tmp_path: Path) -> Path:
    node = tmp_path / "blockdev"
    try:
        os.mknod(node, stat.S_IFBLK | 0o600, os.makedev(240, 0))
    except PermissionError:
        # not root: one of this machine's own, which this user can neither open nor unlink
        existing = sorted(path for path in Path("/dev").iterdir() if path.is_block_device())
        if not existing:
            pytest.skip("no block device here, and making one needs root (CAP_MKNOD)")
        return existing[0]
    return node


@pytest.fixture
def linked_block_device(tmp_path: Path, block_device: Path) -> Path:
    """/scratch/raw -> /dev/nvme1n1, as an operator might point the suite at a drive."""
    link = tmp_path / "scratch" / "raw"
    link.parent.mkdir()
    link.symlink_to(block_device)
    return link


@pytest.fixture
def logging_fio(tmp_path: Path) -> tuple[Path, Path]:
    bindir, log = tmp_path / "bin", tmp_path / "fio.log"
    fake_tools(bindir, log, {"fio": "echo '{}'"})
    return bindir, log


def test_a_symlink_to_a_block_device_is_a_block_device(tmp_path, block_device, linked_block_device):
    regular = tmp_path / "scratch.fio"
    regular.write_text("")
    assert is_block_device(str(block_device)) and is_block_device(str(linked_block_device))
    assert not is_block_device(str(regular))
    assert not is_block_device("/dev/null")  # a character device
    assert not is_block_device(str(tmp_path / "not-yet-laid-out.fio"))


def test_sustained_write_refuses_a_symlink_to_a_block_device(tmp_path, linked_block_device, logging_fio):
    bindir, log = logging_fio
    args = {"filename": str(linked_block_device), "mode": "sustained", "runtime": 1}
    result = run_module(tmp_path, "bench_storage", args, bindir)
    assert result["failed"]
    assert f"refusing a sustained write on {linked_block_device}: it is a block device" in result["msg"]
    assert not log.exists()


def preheat(tmp_path: Path, bindir: Path, target: Path, size: str = "16M") -> subprocess.CompletedProcess:
    extra = {
        "ssd_preheat_target": str(target),
        "ssd_preheat_size": size,
        "ssd_preheat_runtime": 1,
        "ssd_preheat_steadystate_duration": 1,
        "stethoscope_tool_environment": {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"},
        "ansible_python_interpreter": sys.executable,
    }
    play = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local"]
    return subprocess.run(
        [*play, str(TOP / "tests/playbooks/ssd_preheat.yml"), "-e", json.dumps(extra)],
        env=ansible_env(tmp_path, ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.default"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_preheat_refuses_a_symlink_to_a_block_device(tmp_path, linked_block_device, logging_fio):
    bindir, log = logging_fio
    result = preheat(tmp_path, bindir, linked_block_device)
    assert result.returncode != 0
    assert f"ssd_preheat_target {linked_block_device} is a block device" in result.stdout
    assert not log.exists()


def test_preheat_refuses_a_file_larger_than_the_free_space(tmp_path, logging_fio):
    bindir, log = logging_fio
    result = preheat(tmp_path, bindir, tmp_path / "preheat.fio", size="1E")
    assert result.returncode != 0
    assert "needs 1E plus 10 % free" in result.stdout and str(tmp_path) in result.stdout
    assert not log.exists()


def test_preheat_runs_fio_on_a_file_that_fits(tmp_path, logging_fio):
    bindir, log = logging_fio
    result = preheat(tmp_path, bindir, tmp_path / "preheat.fio")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "--rw=randwrite" in log.read_text()


def test_baseline_cleanup_removes_a_scratch_file_but_never_a_device(tmp_path, tmp_dsn, block_device):
    env = ansible_env(tmp_path, tmp_dsn, STETHOSCOPE_LAB_DIR=str(tmp_path / "lab"))
    inventory = tmp_path / "inv" / "hosts.yml"
    build = [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "2", "--inventory"]
    subprocess.run([*build, str(inventory)], env=env, check=True, capture_output=True)
    scratch = tmp_path / "scratch.fio"
    scratch.write_text("")
    play = [str(BIN / "ansible-playbook"), "-i", str(inventory), str(TOP / "playbooks/baseline.yml")]
    for path in (block_device, scratch):
        no_suites = {"baseline_suites": [], "bench_storage_filename": str(path)}
        proc = subprocess.run(
            [*play, "--limit", "node01", "-e", json.dumps(no_suites)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:]
    assert stat.S_ISBLK(block_device.lstat().st_mode)
    assert not scratch.exists()
