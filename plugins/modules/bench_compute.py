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
  - Without a GPU the module is skipped with the reason, unless I(allow_cpu) runs small sizes on the
    CPU (tests do).
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
    default: bf16
  fft_points:
    description: Points of the complex64 FFT (0 skips it).
    type: int
    default: 16777216
  allow_cpu:
    description: Run on the CPU when no GPU is found (small sizes; for tests and laptops).
    type: bool
    default: false
extends_documentation_fragment:
  - aicluster.stethoscope.bench
notes:
  - Needs PyTorch in the Python that runs the module (C(ansible_python_interpreter)).
author:
  - stethoscope developers
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
sustained:
  description: The sustained run (gemms, seconds, tflops) and the clock event reasons seen during it.
  returned: when sustained_seconds > 0
  type: dict
device:
  description: C(cuda:0) or C(cpu), and the GPU name.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.aicluster.stethoscope.plugins.module_utils import compute_bench
from ansible_collections.aicluster.stethoscope.plugins.module_utils.bench_result import bench_result
from ansible_collections.aicluster.stethoscope.plugins.module_utils.module_glue import BENCH_ARGUMENT_SPEC
from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import (
    CLOCK_EVENT_BITS,
    parse_query_gpu_csv,
)
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

QUERY = "index,clocks_event_reasons.active,power.draw,clocks.current.sm,temperature.gpu"


def clock_sampler(module):
    nvidia_smi = module.get_bin_path("nvidia-smi")
    if not nvidia_smi:
        return None

    def sample():
        rc, out, _err = module.run_command(
            [nvidia_smi, "--query-gpu=" + QUERY, "--format=csv"], environ_update={"LC_ALL": "C"}
        )
        if rc != 0:
            return {"error": "exit code %s" % rc}
        try:
            return parse_query_gpu_csv(out)[0]
        except ParseError as exc:
            return {"error": str(exc)}

    return sample


def reasons(mask):
    return sorted(name for name, bit in CLOCK_EVENT_BITS.items() if mask & bit)


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
    if torch.cuda.is_available():
        device, name = "cuda:0", torch.cuda.get_device_name(0)
    elif p["allow_cpu"]:
        device, name = "cpu", "cpu"
    else:
        module.exit_json(
            changed=False,
            skipped=True,
            present=False,
            device="none",
            msg="no CUDA GPU visible to PyTorch and allow_cpu is false",
        )
    if module.check_mode:
        module.exit_json(
            changed=False, device=device, msg="would measure %s on %s" % (", ".join(p["dtypes"]), name)
        )
    measurements = []
    for repetition in range(1, p["repetitions"] + 1):
        for dtype in p["dtypes"]:
            n = p["fp64_size"] if dtype == "fp64" else p["size"]
            rest = p["rest_seconds"] if device != "cpu" else 0.0
            burst = compute_bench.gemm_burst(torch, device, dtype, n, p["iterations"], p["warmup"], rest)
            measurements.append(
                {
                    "metric_name": "bench_gemm_tflops",
                    "device": "gpu0" if device != "cpu" else "cpu",
                    "labels": {"dtype": dtype, "size": str(n), "mode": "burst"},
                    "value": burst["tflops"],
                    "unit": "tflops",
                    "repetition": repetition,
                }
            )
        if p["fft_points"]:
            ms = compute_bench.fft_ms(torch, device, p["fft_points"], p["iterations"], p["warmup"])
            measurements.append(
                {
                    "metric_name": "bench_fft_ms",
                    "device": "gpu0" if device != "cpu" else "cpu",
                    "labels": {"dtype": "c64", "size": str(p["fft_points"]), "mode": "burst"},
                    "value": ms,
                    "unit": "ms",
                    "repetition": repetition,
                }
            )
    extra = {}
    if p["sustained_seconds"] > 0:
        sampler = clock_sampler(module) if device != "cpu" else None
        n = p["fp64_size"] if p["sustained_dtype"] == "fp64" else p["size"]
        run = compute_bench.gemm_sustained(
            torch, device, p["sustained_dtype"], n, p["sustained_seconds"], sampler
        )
        mask = 0
        for sample in run["samples"]:
            mask |= int(sample.get("clocks_event_reasons.active") or 0)
        run["clock_event_mask"] = mask
        run["clock_event_reasons"] = reasons(mask)
        extra["sustained"] = run
        measurements.append(
            {
                "metric_name": "bench_gemm_tflops",
                "device": "gpu0" if device != "cpu" else "cpu",
                "labels": {"dtype": p["sustained_dtype"], "size": str(n), "mode": "sustained"},
                "value": run["tflops"],
                "unit": "tflops",
                "repetition": 1,
            }
        )
    bench, rows, stability = bench_result("compute", measurements, p["fingerprint"], p["max_rsd_percent"])
    module.exit_json(
        changed=False,
        device="%s (%s)" % (device, name),
        stethoscope_bench=bench,
        stethoscope_metrics=rows,
        stability=stability,
        **extra,
    )


if __name__ == "__main__":
    main()
