#!/usr/bin/python
# Copyright: stethoscope developers
# Apache License 2.0

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_compute
short_description: GPU GEMM and FFT throughput with PyTorch, burst and sustained
version_added: "0.1.0"
description:
  - Times C(torch.matmul) per dtype (bf16, fp16, tf32, fp32, fp64) with CUDA events, the median of
    I(iterations) runs after I(warmup) (burst), for I(repetitions) repetitions, and a complex64 FFT.
  - A sustained run of back-to-back GEMMs for I(sustained_seconds) shows power capping (an H200 at its
    700 W cap gives about 655 TFLOP/s bf16 sustained against 761 in a burst); the clock event reasons
    seen meanwhile (C(nvidia-smi --query-gpu)) are returned with it.
  - Every visible GPU is measured by its own worker process, all at once (the node's power and thermal
    envelope, as in training); results carry the label C(gpu=N) and the device C(gpuN), N in
    nvidia-smi's (PCI bus) order. Clocks and clock event reasons of every GPU are sampled while they
    run (C(nvidia-smi --query-gpu) under C(timeout); C(clocks_event_reasons), or
    C(clocks_throttle_reasons) on drivers older than 535).
  - Each GPU's first burst product per dtype is checked against a reference computed another way
    (fp64 on the CPU) and a mismatch fails that GPU (C(bench_gemm_mismatch=1), silent data
    corruption). Every GPU computes the same seeded GEMM, and the checksums of its product are compared
    bit-exactly across the node's GPUs (C(bench_gemm_quorum_suspect) for the odd one out; a tie is no
    verdict) and are stored (C(bench_gemm_checksum)) for the same comparison across the class.
  - Each GPU's shortfall against the median of its node's GPUs is C(bench_gemm_below_siblings_percent).
  - Without a GPU the module is skipped with the reason, unless I(allow_cpu) runs small sizes on
    I(cpu_standins) CPU worker processes of one thread each, standing in for GPUs (labelled
    C(standin=cpu), devices C(cpuN)), so the per-device concurrency, the checks and the sibling
    comparison run for real (tests and the lab do).
  - Each metric whose repetitions spread by more than I(max_rsd_percent) is flagged C(unstable).
options:
  dtypes:
    description: Data types to measure.
    type: list
    elements: str
    choices: [bf16, fp16, tf32, fp32, fp64]
    default: [bf16, fp16, tf32, fp32, fp64]
  size:
    description: Matrix size N of the N x N x N GEMMs (fp64 uses I(fp64_size)).
    type: int
    default: 8192
  fp64_size:
    description: Matrix size for fp64.
    type: int
    default: 4096
  iterations:
    description: Timed GEMMs per dtype and repetition.
    type: int
    default: 20
  warmup:
    description: Untimed GEMMs before timing.
    type: int
    default: 3
  rest_seconds:
    description: Idle seconds before each burst, so that a burst starts from a rested GPU (back-to-back bursts measure the power cap instead).
    type: float
    default: 5
  sustained_seconds:
    description: Length of the sustained run (0 skips it).
    type: int
    default: 30
  sustained_dtype:
    description: Data type of the sustained run.
    type: str
    choices: [bf16, fp16, tf32, fp32, fp64]
    default: bf16
  fft_points:
    description: Points of the complex64 FFT (0 skips it).
    type: int
    default: 16777216
  allow_cpu:
    description: Run on the CPU when no GPU is found (small sizes; for tests and laptops).
    type: bool
    default: false
  cpu_standins:
    description: With I(allow_cpu) and no GPU, how many CPU worker processes (one thread each) stand in for GPUs.
    type: int
    default: 2
  device_timeout:
    description: Seconds the workers may take together before they are killed and reported.
    type: int
    default: 3600
  inject_error_device:
    description:
      - Fault injection for tests and the lab's C(sdc) node, never for production; corrupt this
        device's first product between compute and check. -1 injects nothing.
    type: int
    default: -1
extends_documentation_fragment:
  - aicluster.stethoscope.bench
notes:
  - Needs PyTorch in the Python that runs the module (C(ansible_python_interpreter)).
author:
  - stethoscope developers (@aicluster)
"""

EXAMPLES = r"""
- name: GEMM and FFT on every GPU node
  aicluster.stethoscope.bench_compute:
    fingerprint: "{{ __fingerprint.stethoscope_fingerprint }}"

- name: Small sizes on the CPU (CI)
  aicluster.stethoscope.bench_compute:
    allow_cpu: true
    size: 256
    fp64_size: 128
    sustained_seconds: 2
"""

RETURN = r"""
stethoscope_bench:
  description: Suite C(compute), fingerprints and every repetition's result (C(bench_gemm_tflops) with labels dtype, size, mode; C(bench_fft_ms)).
  returned: success
  type: dict
stethoscope_metrics:
  description: Median over repetitions of each result (label stat=median), catalog names.
  returned: success
  type: list
  elements: dict
stability:
  description: Per metric the repetitions, median, relative standard deviation (percent) and the unstable flag.
  returned: success
  type: list
  elements: dict
device:
  description: What was measured (C(8 x NVIDIA H100 80GB HBM3), C(2 x CPU stand-in)).
  returned: always
  type: str
devices:
  description: Per device its index, name, correctness checks (dtype, ok, error, tolerance, checksum), quorum
    verdict, clock event reasons seen during the run, and error if its worker failed.
  returned: success
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import compute_bench, compute_workers
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import BENCH_ARGUMENT_SPEC
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import CLOCK_EVENT_BITS


def clock_sampler(module):
    """-> sample() returning {index: row} for every GPU (or {"error": ...}), or None without nvidia-smi."""
    nvidia_smi = module.get_bin_path("nvidia-smi")
    if not nvidia_smi:
        return None
    timeout = module.get_bin_path("timeout")

    def run(argv):
        if timeout:
            argv = [timeout, "-k", "2", str(compute_workers.SAMPLE_TIMEOUT), *argv]
        return module.run_command(
            argv, environ_update={"LC_ALL": "C", "LANGUAGE": "C"}, expand_user_and_vars=False
        )

    return compute_workers.ClockSampler(run, nvidia_smi).sample


def reasons(mask):
    return sorted(name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit)


def count_gpus(torch):
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def verdict_rows(index, kind, result, votes):
    """The per-device verdict metrics: mismatch against the reference, quorum, checksum."""
    device = compute_workers.device_name(index, kind)
    label = compute_workers.device_labels(index, kind)
    rows = []
    for check in result.get("checks", []):
        labels = dict(label, dtype=check["dtype"], size=str(check["size"]))
        rows.append(dict(metric_name="bench_gemm_mismatch", labels=labels, value=0.0 if check["ok"] else 1.0))
        rows.append(dict(metric_name="bench_gemm_checksum", labels=labels, value=float(check["checksum"])))
        vote = votes.get(check["dtype"], {}).get(index)
        if vote is not None:
            rows.append(
                dict(metric_name="bench_gemm_quorum_suspect", labels=labels, value=0.0 if vote else 1.0)
            )
    for row in rows:
        row.update(device=device, unit="flag" if row["metric_name"] != "bench_gemm_checksum" else "checksum")
        row["repetition"] = 1
    return rows


def sibling_rows(results, devices):
    """bench_gemm_below_siblings_percent per device and (dtype, mode), from each one's median."""
    kinds = {index: kind for index, kind, _env in devices}
    medians = {}
    for index, result in results.items():
        for m in result.get("measurements", []):
            if m["metric_name"] == "bench_gemm_tflops":
                key = (m["labels"]["dtype"], m["labels"]["size"], m["labels"]["mode"])
                medians.setdefault(key, {}).setdefault(index, []).append(m["value"])
    rows = []
    for (dtype, size, mode), per_device in sorted(medians.items()):
        values = {index: sorted(v)[len(v) // 2] for index, v in per_device.items()}
        for index, percent in sorted(compute_workers.below_siblings(values).items()):
            labels = dict(
                compute_workers.device_labels(index, kinds[index]), dtype=dtype, size=size, mode=mode
            )
            rows.append(
                dict(
                    metric_name=compute_workers.SIBLING_METRIC,
                    device=compute_workers.device_name(index, kinds[index]),
                    labels=labels,
                    value=round(percent, 3),
                    unit="percent",
                    repetition=1,
                )
            )
    return rows


def main():
    module = AnsibleModule(
        argument_spec={
            "dtypes": {
                "type": "list",
                "elements": "str",
                "choices": list(compute_bench.DTYPES),
                "default": list(compute_bench.DTYPES),
            },
            "size": {"type": "int", "default": 8192},
            "fp64_size": {"type": "int", "default": 4096},
            "iterations": {"type": "int", "default": 20},
            "warmup": {"type": "int", "default": 3},
            "rest_seconds": {"type": "float", "default": 5.0},
            "sustained_seconds": {"type": "int", "default": 30},
            "sustained_dtype": {"type": "str", "default": "bf16", "choices": list(compute_bench.DTYPES)},
            "fft_points": {"type": "int", "default": 16777216},
            "allow_cpu": {"type": "bool", "default": False},
            "cpu_standins": {"type": "int", "default": 2},
            "device_timeout": {"type": "int", "default": 3600},
            "inject_error_device": {"type": "int", "default": -1},
            **BENCH_ARGUMENT_SPEC,
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        import torch
    except ImportError as exc:
        module.exit_json(
            changed=False,
            skipped=True,
            present=False,
            device="none",
            msg="PyTorch is not importable by %s: %s" % (module._name, exc),
        )
    gpus = count_gpus(torch)
    if not gpus and not p["allow_cpu"]:
        module.exit_json(
            changed=False,
            skipped=True,
            present=False,
            device="none",
            msg="no CUDA GPU visible to PyTorch and allow_cpu is false",
        )
    if not gpus and p["cpu_standins"] < 1:
        module.fail_json(msg="bench_compute: cpu_standins must be at least 1, got %s" % p["cpu_standins"])
    devices = compute_workers.plan_devices(gpus, p["cpu_standins"], os.environ.get("CUDA_VISIBLE_DEVICES"))
    what = "%d x %s" % (len(devices), torch.cuda.get_device_name(0) if gpus else "CPU stand-in")
    if module.check_mode:
        module.exit_json(
            changed=False, device=what, msg="would measure %s on %s" % (", ".join(p["dtypes"]), what)
        )
    params = {k: p[k] for k in ("dtypes", "size", "fp64_size", "iterations", "warmup", "repetitions")}
    params.update(
        rest_seconds=p["rest_seconds"] if gpus else 0.0,
        sustained_seconds=p["sustained_seconds"],
        sustained_dtype=p["sustained_dtype"],
        fft_points=p["fft_points"],
        inject_error_device=p["inject_error_device"],
    )
    sampler = clock_sampler(module) if gpus else None
    results, samples = compute_workers.run_workers(devices, params, p["device_timeout"], sampler)
    failed = {index: r["error"] for index, r in results.items() if "error" in r}
    checksums = {}
    for index, result in results.items():
        for check in result.get("checks", []):
            checksums.setdefault(check["dtype"], {})[index] = check["checksum"]
    votes = {dtype: compute_workers.quorum(values) for dtype, values in checksums.items()}
    measurements, report = [], []
    for index, kind, _env in devices:
        result = results[index]
        device = compute_workers.device_name(index, kind)
        for m in result.get("measurements", []):
            measurements.append(dict(m, device=device))
        measurements.extend(verdict_rows(index, kind, result, votes))
        masks = [s[index]["mask"] for s in samples if index in s]
        mask = 0
        for value in masks:
            mask |= value
        entry = {
            "index": index,
            "device": device,
            "name": result.get("name", ""),
            "checks": result.get("checks", []),
            "quorum": {d: ("agrees" if v[index] else "odd one out") for d, v in votes.items() if index in v},
            "clock_event_mask": mask,
            "clock_event_reasons": reasons(mask),
            "clock_samples": len(masks),
            "sustained": result.get("sustained"),
        }
        if index in failed:
            entry["error"] = failed[index]
        report.append(entry)
    measurements.extend(sibling_rows(results, devices))
    if not measurements:
        module.fail_json(msg="bench_compute: no device produced a result: %s" % failed, devices=report)
    bench, rows, stability = bench_result("compute", measurements, p["fingerprint"], p["max_rsd_percent"])
    mismatched = [e["device"] for e in report if any(not c["ok"] for c in e["checks"])]
    sample_errors = sorted({s["error"] for s in samples if "error" in s})
    for warning in sample_errors:
        module.warn("clock sampling: %s" % warning)
    module.exit_json(
        changed=False,
        failed=bool(failed or mismatched),
        msg="; ".join(
            [
                "%s failed: %s" % (compute_workers.device_name(i, "cuda" if gpus else "cpu"), e)
                for i, e in failed.items()
            ]
            + ["%s: GEMM result differs from the reference (silent data corruption)" % d for d in mismatched]
        )
        or "measured %s" % what,
        device=what,
        devices=report,
        stethoscope_bench=bench,
        stethoscope_metrics=rows,
        stability=stability,
    )


if __name__ == "__main__":
    main()
