# Copyright: stethoscope developers
# Apache License 2.0
"""One worker process per device, all measuring at once (a node's power and thermal envelope is what
training sees), and what is compared across them afterwards: siblings' medians and the checksum
quorum. The parent never imports torch; each worker does, for its one device.

A worker sees one GPU (CUDA_VISIBLE_DEVICES, in PCI bus order so index N is nvidia-smi's GPU N), or,
as a CPU stand-in for a GPU, the CPU with one thread."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from ansible_collections.aicluster.stethoscope.plugins.module_utils.nvidia_smi import parse_query_gpu_csv
from ansible_collections.aicluster.stethoscope.plugins.module_utils.parse_error import ParseError

WORKER = (
    "import sys\n"
    "from ansible_collections.aicluster.stethoscope.plugins.module_utils.compute_workers import worker_main\n"
    "worker_main()\n"
)
SIBLING_METRIC = "bench_gemm_below_siblings_percent"


# ---------------------------------------------------------------------------------------------
# the worker (child process)
# ---------------------------------------------------------------------------------------------
def _measure(torch, compute_bench, device, p):
    measurements, checks = [], []
    label = p["label"]
    for repetition in range(1, p["repetitions"] + 1):
        for dtype in p["dtypes"]:
            n = p["fp64_size"] if dtype == "fp64" else p["size"]
            burst = compute_bench.gemm_burst(
                torch,
                device,
                dtype,
                n,
                p["iterations"],
                p["warmup"],
                p["rest_seconds"],
                check=repetition == 1,
                inject_error=repetition == 1 and p["inject_error"],
            )
            labels = dict(label, dtype=dtype, size=str(n), mode="burst")
            measurements.append(dict(metric_name="bench_gemm_tflops", labels=labels, value=burst["tflops"]))
            measurements[-1].update(unit="tflops", repetition=repetition)
            if "check" in burst:
                checks.append(dict(burst["check"], dtype=dtype, size=n, checksum=burst["checksum"]))
        if p["fft_points"]:
            ms = compute_bench.fft_ms(torch, device, p["fft_points"], p["iterations"], p["warmup"])
            labels = dict(label, dtype="c64", size=str(p["fft_points"]), mode="burst")
            measurements.append(
                dict(metric_name="bench_fft_ms", labels=labels, value=ms, unit="ms", repetition=repetition)
            )
    sustained = None
    if p["sustained_seconds"] > 0:
        dtype = p["sustained_dtype"]
        n = p["fp64_size"] if dtype == "fp64" else p["size"]
        sustained = compute_bench.gemm_sustained(torch, device, dtype, n, p["sustained_seconds"])
        labels = dict(label, dtype=dtype, size=str(n), mode="sustained")
        measurements.append(
            dict(metric_name="bench_gemm_tflops", labels=labels, value=sustained["tflops"], unit="tflops")
        )
        measurements[-1]["repetition"] = 1
    return measurements, checks, sustained


def worker_main():
    """Reads its parameters (one JSON line), says `ready` once torch is up, measures on `go`."""
    p = json.loads(sys.stdin.readline())
    import torch

    from ansible_collections.aicluster.stethoscope.plugins.module_utils import compute_bench

    if p["kind"] == "cpu":
        torch.set_num_threads(1)
        device, name = "cpu", "CPU stand-in"
    else:
        device, name = "cuda:0", torch.cuda.get_device_name(0)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()  # go: every worker starts at once
    try:
        measurements, checks, sustained = _measure(torch, compute_bench, device, p)
        result = {"name": name, "measurements": measurements, "checks": checks, "sustained": sustained}
    except Exception as exc:  # the parent reports it against this device
        result = {"name": name, "error": "%s: %s" % (type(exc).__name__, exc)}
    with open(p["result_path"], "w", encoding="utf-8") as handle:
        json.dump(result, handle)


# ---------------------------------------------------------------------------------------------
# the parent
# ---------------------------------------------------------------------------------------------
def plan_devices(gpu_count, cpu_standins, visible=None):
    """[(index, kind, env)] for each worker: every visible GPU, else `cpu_standins` CPU stand-ins."""
    if gpu_count:
        ids = [v.strip() for v in (visible or "").split(",") if v.strip()] or [
            str(i) for i in range(gpu_count)
        ]
        return [
            (int(ids[i]) if ids[i].isdigit() else i, "cuda", {"CUDA_VISIBLE_DEVICES": ids[i]})
            for i in range(min(gpu_count, len(ids)))
        ]
    single = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    return [(i, "cpu", dict(single, CUDA_VISIBLE_DEVICES="")) for i in range(cpu_standins)]


def device_name(index, kind):
    return ("gpu%d" if kind == "cuda" else "cpu%d") % index


def device_labels(index, kind):
    labels = {"gpu": str(index)}
    if kind == "cpu":
        labels["standin"] = "cpu"  # a CPU process standing in for GPU N, never graded as a GPU
    return labels


def run_workers(devices, params, timeout, sampler=None, sample_every=2.0):
    """Starts one worker per device, releases them together, samples clocks while they run.
    -> ({index: result}, [samples]); a worker past `timeout` is killed and reported as an error."""
    scratch = tempfile.mkdtemp(prefix="stethoscope-compute-")
    env_base = dict(
        os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), CUDA_DEVICE_ORDER="PCI_BUS_ID"
    )
    workers = {}
    for index, kind, env in devices:
        process = subprocess.Popen(
            [sys.executable, "-c", WORKER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(env_base, **env),
            text=True,
        )
        own = dict(params, kind=kind, label=device_labels(index, kind))
        own["result_path"] = os.path.join(scratch, "%d.json" % index)
        own["inject_error"] = params.get("inject_error_device") == index
        process.stdin.write(json.dumps(own) + "\n")
        process.stdin.flush()
        workers[index] = (process, own["result_path"])
    deadline = time.monotonic() + timeout
    for process, _path in workers.values():
        process.stdout.readline()  # ready (or EOF if it died: its missing result says so)
    for process, _path in workers.values():
        try:
            process.stdin.write("go\n")
            process.stdin.close()
        except BrokenPipeError:
            pass
    samples, last = [], 0.0
    while any(process.poll() is None for process, _path in workers.values()):
        now = time.monotonic()
        if now > deadline:
            for process, _path in workers.values():
                if process.poll() is None:
                    process.kill()
            break
        if sampler is not None and now - last >= sample_every:
            samples.append(sampler())
            last = now
        time.sleep(0.1)
    results = {}
    for index, (process, path) in workers.items():
        process.wait()
        try:
            with open(path, encoding="utf-8") as handle:
                results[index] = json.load(handle)
        except (OSError, ValueError):
            why = "killed after %ss" % timeout if process.returncode and process.returncode < 0 else None
            results[index] = {"error": why or "worker exited %s without a result" % process.returncode}
        if os.path.exists(path):
            os.unlink(path)
    os.rmdir(scratch)
    return results, samples


# drivers before 535 name the field clocks_throttle_reasons; the new name is tried first, once
REASON_FIELDS = ("clocks_event_reasons", "clocks_throttle_reasons")
QUERY = "index,%s.active,power.draw,clocks.current.sm,temperature.gpu"
SAMPLE_TIMEOUT = 10


class ClockSampler:
    """Every GPU's clocks and clock event reasons in one nvidia-smi call. `run(argv) -> (rc, out, err)`
    wraps the call in `timeout` (nvidia-smi on a sick GPU hangs)."""

    def __init__(self, run, nvidia_smi="nvidia-smi"):
        self.run, self.nvidia_smi = run, nvidia_smi
        self.fields = list(REASON_FIELDS)

    def sample(self):
        """-> {index: row with `mask`} or {"error": why}."""
        while self.fields:
            field = self.fields[0]
            rc, out, err = self.run([self.nvidia_smi, "--query-gpu=" + QUERY % field, "--format=csv"])
            if rc == 124:
                return {"error": "nvidia-smi timed out after %ss" % SAMPLE_TIMEOUT}
            if rc != 0 and "valid field" in (out + err) and len(self.fields) > 1:
                self.fields.pop(0)  # an older driver's field name
                continue
            if rc != 0:
                return {"error": "nvidia-smi: exit code %s: %s" % (rc, (err or out).strip()[:200])}
            try:
                rows = parse_query_gpu_csv(out)
            except ParseError as exc:
                return {"error": str(exc)}
            return {int(row["index"]): dict(row, mask=int(row.get(field + ".active") or 0)) for row in rows}
        return {"error": "nvidia-smi knows neither clock reason field"}


def quorum(checksums):
    """{device: checksum} of one seeded GEMM -> {device: True (agrees) | False (the odd one out)},
    or {} when there is no verdict (fewer than 3, or no strict majority: a tie)."""
    if len(checksums) < 3:
        return {}
    counts = {}
    for value in checksums.values():
        counts[value] = counts.get(value, 0) + 1
    majority, votes = max(counts.items(), key=lambda item: item[1])
    if votes * 2 <= len(checksums):
        return {}
    return {device: value == majority for device, value in checksums.items()}


def below_siblings(values):
    """{device: value} of one metric (higher is better) -> {device: percent below the node's median}."""
    if len(values) < 2:
        return {}
    median = statistics.median(values.values())
    if median <= 0:
        return {}
    return {device: max(0.0, (median - value) / median * 100.0) for device, value in values.items()}
