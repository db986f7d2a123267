#!/usr/bin/env python3
"""GPU-machine check, every GPU path at once, no Ansible: the node-side collectors against a real GPU
node (root=/), then bench_compute's GEMM/FFT measurement compared with the H200 reference figures
(tests/fixtures/real/h200-vm: bf16 761.5 TFLOP/s burst at 8192^3, 654.7 sustained at the 700 W cap).

Run on a machine with an NVIDIA GPU and PyTorch: python3 benchmarks/gpu_device_check.py OUTDIR [--quick]
Writes OUTDIR/collectors.json (each collector's facts, metric rows, warnings or error), the raw tool
outputs the collectors parsed, and OUTDIR/compute.json (every measurement and the comparison).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import write_results

TOP = Path(__file__).resolve().parent.parent


def importable_collection() -> None:
    """Make ansible_collections.aicluster.stethoscope importable from this checkout."""
    farm = Path(tempfile.mkdtemp()) / "ansible_collections" / "aicluster"
    farm.mkdir(parents=True)
    (farm / "stethoscope").symlink_to(TOP)
    sys.path.insert(0, str(farm.parent.parent))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("outdir", nargs="?", type=Path, default=Path("gpu-check"))
    parser.add_argument("--quick", action="store_true", help="shorter GEMM runs")
    args = parser.parse_args()
    out = args.outdir
    out.mkdir(parents=True, exist_ok=True)
    importable_collection()
    from ansible_collections.aicluster.stethoscope.plugins.module_utils import (
        collect_gpu,
        collect_nvlink,
        collect_pcie,
        collect_tuning,
    )
    from ansible_collections.aicluster.stethoscope.plugins.module_utils.collector_context import (
        CollectorError,
        Context,
    )

    raw: list[dict] = []

    def runner(argv, timeout, env=None):
        path = shutil.which(argv[0])
        if path is None:
            return 127, "", f"{argv[0]}: not found"
        proc = subprocess.run(
            ["timeout", str(timeout), path, *argv[1:]],
            capture_output=True,
            text=True,
            env={**os.environ, "LC_ALL": "C", "LANGUAGE": "C", **(env or {})},
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
    write_results(out / "collectors.json", report)
    write_results(out / "raw_outputs.json", {"outputs": raw})
    for name, item in report.items():
        rows = item.get("metrics", [])
        print(
            f"{name}: present={item.get('present')} rows={len(rows)} error={item.get('error')} "
            f"warnings={item.get('warnings')} {item['seconds']}s"
        )
        for row in rows[:40]:
            print(f"   {row['name']}{{{row['device']}}} {row['labels'] or ''} = {row['value']}")
    compute_ok = compute_check(out, quick=args.quick)
    return 0 if compute_ok and all("error" not in item for item in report.values()) else 1


def compute_check(out: Path, quick: bool) -> bool:
    """bench_compute's own functions, at the reference's sizes, compared within 5 %."""
    import torch

    from ansible_collections.aicluster.stethoscope.plugins.module_utils import compute_bench
    from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import (
        relative_stddev_percent,
    )
    from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import (
        parse_query_gpu_csv,
    )

    reference = json.loads(
        (TOP / "tests/fixtures/real/h200-vm/commands/torch_reference_bench.json").read_text()
    )
    sustained_reference = 654.7  # tests/fixtures/real/h200-vm/under-load/load_result.txt
    if not torch.cuda.is_available():
        print("compute: no CUDA device; skipped")
        return True

    def sampler():
        proc = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,clocks_event_reasons.active,power.draw,clocks.current.sm,temperature.gpu",
                "--format=csv",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return parse_query_gpu_csv(proc.stdout)[0] if proc.returncode == 0 else {"rc": proc.returncode}

    report: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0), "burst": {}}
    sizes = {"bf16": 8192, "fp16": 8192, "tf32": 8192, "fp32": 8192, "fp64": 4096}
    ok = True
    for dtype, n in sizes.items():
        runs = [
            compute_bench.gemm_burst(torch, "cuda:0", dtype, n, 20, 3, rest_seconds=5)["tflops"]
            for _ in range(3)
        ]
        median = sorted(runs)[1]
        ref = reference[f"gemm_{dtype}_tflops_n{n}"]
        within = abs(median - ref) / ref * 100
        report["burst"][dtype] = {
            "n": n,
            "repetitions_tflops": runs,
            "median": median,
            "reference": ref,
            "deviation_percent": round(within, 2),
            "rsd_percent": round(relative_stddev_percent(runs), 3),
        }
        ok &= within <= 5.0 if dtype in ("bf16", "fp16") else True
        print(
            f"compute burst {dtype} n={n}: {median:.1f} TFLOP/s (reference {ref}, {within:.1f} % off, "
            f"RSD {relative_stddev_percent(runs):.2f} %)"
        )
    fft = compute_bench.fft_ms(torch, "cuda:0", 1 << 24, 20, 3)
    report["fft_c64_2e24_ms"] = {"median": fft, "reference": reference["fft_c64_2e24_ms"]}
    print(f"compute fft c64 2^24: {fft:.3f} ms (reference {reference['fft_c64_2e24_ms']})")
    seconds = 10 if quick else 30
    run = compute_bench.gemm_sustained(torch, "cuda:0", "bf16", 8192, seconds, sampler)
    mask = 0
    for sample in run["samples"]:
        mask |= int(sample.get("clocks_event_reasons.active") or 0)
    deviation = abs(run["tflops"] - sustained_reference) / sustained_reference * 100
    report["sustained"] = {
        **run,
        "clock_event_mask": mask,
        "reference": sustained_reference,
        "deviation_percent": round(deviation, 2),
    }
    ok &= deviation <= 5.0 or quick
    print(
        f"compute sustained bf16 {seconds}s: {run['tflops']:.1f} TFLOP/s over {run['gemms']} GEMMs "
        f"(reference {sustained_reference}, {deviation:.1f} % off), clock event mask {mask:#x}, "
        f"power samples {[s.get('power.draw') for s in run['samples']]}"
    )
    write_results(out / "compute.json", report)
    return ok


if __name__ == "__main__":
    sys.exit(main())
