"""ssd_preheat: fio for real on a temp file (a block device refused:
tests/plugins/modules/test_storage_device_safety.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TOP, ansible_env

PLAYBOOK = TOP / "tests/playbooks/ssd_preheat.yml"


def play(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            str(PLAYBOOK),
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            *extra,
        ],
        env=ansible_env(tmp_path, ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.default"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio (Debian package) is installed by .ci/run")
def test_preconditions_a_file(tmp_path):
    target = tmp_path / "preheat.fio"
    result = play(
        tmp_path,
        "-e",
        f"ssd_preheat_target={target}",
        "-e",
        "ssd_preheat_size=16M",
        "-e",
        "ssd_preheat_runtime=2",
        "-e",
        "ssd_preheat_steadystate_duration=1",
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert target.stat().st_size == 16 * 1024 * 1024 and "steady state" in result.stdout
