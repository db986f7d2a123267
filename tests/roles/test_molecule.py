"""Molecule: converge health_collect on the lab, check mode, idempotence, verify rows in ClickHouse."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TOP

SCENARIOS = sorted(p.name for p in (TOP / "molecule").iterdir() if (p / "molecule.yml").is_file())


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario):
    if scenario == "slurm_drain":
        from slurm_lab import missing_tools

        if missing_tools():
            pytest.skip(f"Slurm is not installed here ({', '.join(missing_tools())}); .ci/run installs it")
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
        "ANSIBLE_CONFIG": str(TOP / "ansible.cfg"),
    }
    result = subprocess.run(
        [str(bindir / "molecule"), "test", "-s", scenario],
        cwd=TOP,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    output = result.stdout + result.stderr
    fatal = [
        line for line in output.splitlines() if "fatal:" in line or "FAILED!" in line or "assertion" in line
    ]
    assert result.returncode == 0, "\n".join(fatal[:20]) + "\n...\n" + output[-4000:]
    assert "failed=0" in result.stdout + result.stderr
