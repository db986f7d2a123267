#!/usr/bin/env python3
"""Reproducibility of the storage suite: three repetitions of fio 4k random read (iodepth 64, libaio,
direct) through the bench_storage module, on a file on this machine and on the lab's recorded output;
prints each run and the relative standard deviation the baseline report shows.

    .venv/bin/python benchmarks/storage_reproducibility.py [--runtime 10] [--size 1G]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from provenance import write_results

TOP = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(tmp: Path, bindir: Path, args: dict) -> dict:
    tree = tmp / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(TOP / "ansible.cfg"),
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
        "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
    }
    subprocess.run(
        [
            str(BIN / "ansible"),
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-m",
            "aicluster.stethoscope.bench_storage",
            "-a",
            json.dumps(args),
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        env=env,
        capture_output=True,
        check=True,
    )
    return json.loads((tree / "localhost").read_text())


def summary(result: dict) -> dict:
    iops = [
        r["value"]
        for r in result["stethoscope_bench"]["results"]
        if r["metric_name"] == "bench_fio_randread_iops"
    ]
    p99 = [
        r["value"]
        for r in result["stethoscope_bench"]["results"]
        if r["metric_name"] == "bench_fio_randread_latency_p99_us"
    ]
    stability = {s["metric_name"]: s["rsd_percent"] for s in result["stability"]}
    return {"iops": [round(v) for v in iops], "p99_us": p99, "rsd_percent": stability}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime", type=int, default=10)
    parser.add_argument("--size", default="1G")
    parser.add_argument("--out", type=Path, default=TOP / "benchmarks/results/storage_reproducibility.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("STETHOSCOPE_BENCH_DIR", "/var/tmp")) as tmp:
        tmp_path = Path(tmp)
        system = tmp_path / "bin"
        system.mkdir()
        (system / "fio").symlink_to(shutil.which("fio"))
        real = run(
            tmp_path,
            system,
            {
                "filename": str(tmp_path / "scratch.fio"),
                "size": args.size,
                "runtime": args.runtime,
                "repetitions": 3,
            },
        )
        subprocess.run(
            [sys.executable, str(TOP / "tools/lab.py"), "build", "--nodes", "1"],
            check=True,
            capture_output=True,
            env={**os.environ, "STETHOSCOPE_LAB_DIR": str(tmp_path / "lab")},
        )
        lab = run(
            tmp_path,
            tmp_path / "lab/nodes/node01/bin",
            {"filename": str(tmp_path / "lab.fio"), "repetitions": 3},
        )
    figures = {
        "this_machine": {"runtime_s": args.runtime, "size": args.size, **summary(real)},
        "lab_replay": summary(lab),
    }
    print(json.dumps(figures, indent=1))
    write_results(args.out, figures)


if __name__ == "__main__":
    main()
