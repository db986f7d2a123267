#!/usr/bin/env python3
"""GPU-machine check: run the node-side collectors against a real GPU node (root=/), no Ansible.

Run on a machine with an NVIDIA GPU: python3 benchmarks/gpu_device_check.py OUTDIR
Writes OUTDIR/collectors.json (each collector's facts, metric rows, warnings or error) and the raw
tool outputs the collectors parsed, so a parser fault can be reproduced from them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent


def importable_collection() -> None:
    """Make ansible_collections.aicluster.stethoscope importable from this checkout."""
    farm = Path(tempfile.mkdtemp()) / "ansible_collections" / "aicluster"
    farm.mkdir(parents=True)
    (farm / "stethoscope").symlink_to(TOP)
    sys.path.insert(0, str(farm.parent.parent))


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-check")
    out.mkdir(parents=True, exist_ok=True)
    importable_collection()
    from ansible_collections.aicluster.stethoscope.plugins.module_utils import (
        collect_gpu,
        collect_nvlink,
        collect_pcie,
        collect_tuning,
    )
    from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector import (
        CollectorError,
        Context,
    )

    raw: list[dict] = []

    def runner(argv, timeout):
        path = shutil.which(argv[0])
        if path is None:
            return 127, "", f"{argv[0]}: not found"
        proc = subprocess.run(
            ["timeout", str(timeout), path, *argv[1:]],
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C", "LANGUAGE": "C"},
            check=False,
        )
        raw.append({"argv": argv, "rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr})
        return proc.returncode, proc.stdout, proc.stderr

    state = tempfile.mkdtemp()
    ctx = Context(runner, shutil.which, root="/", state_dir=state, timeout=30)
    report = {}
    for name, collect in (
        ("gpu", lambda: collect_gpu.collect(ctx, 2)),
        ("nvlink", lambda: collect_nvlink.collect(ctx)),
        ("pcie_aer", lambda: collect_pcie.collect(ctx)),
        ("tuning", lambda: collect_tuning.collect(ctx)),
    ):
        started = time.perf_counter()
        try:
            report[name] = collect()
        except CollectorError as exc:
            report[name] = {"error": exc.msg, "cmd": exc.cmd, "rc": exc.rc}
        report[name]["seconds"] = round(time.perf_counter() - started, 3)
    (out / "collectors.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "raw_outputs.json").write_text(json.dumps(raw, indent=1))
    for name, item in report.items():
        rows = item.get("metrics", [])
        print(
            f"{name}: present={item.get('present')} rows={len(rows)} error={item.get('error')} "
            f"warnings={item.get('warnings')} {item['seconds']}s"
        )
        for row in rows[:40]:
            print(f"   {row['name']}{{{row['device']}}} {row['labels'] or ''} = {row['value']}")
    return 0 if all("error" not in item for item in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
