# Copyright: stethoscope developers
# Apache License 2.0
"""GEMM and FFT throughput with PyTorch: median of timed runs after warm-up (burst), and a sustained
run of back-to-back GEMMs long enough for power capping to show. Timing uses device events on CUDA
and the monotonic clock on CPU. `torch` is passed in, so this file imports without it.

Each burst's last product is checked against a reference computed another way, in fp64 on the CPU
(`check_product`), and reduced to a checksum of its bits for the quorum across GPUs and nodes."""

from __future__ import annotations

import hashlib
import statistics
import time

# PyTorch names; tf32 is fp32 storage with TF32 tensor-core math allowed.
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "tf32": "float32", "fp32": "float32", "fp64": "float64"}


class Timer:
    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.startswith("cuda")

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_ms(self, fn):
        """Wall time of one call in ms (device events on CUDA, so launch overhead does not count)."""
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        started = time.perf_counter()
        fn()
        return (time.perf_counter() - started) * 1000.0


def _set_tf32(torch, enabled):
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def _operands(torch, device, dtype_name, n):
    dtype = getattr(torch, DTYPES[dtype_name])
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=generator)
    return a, b


# Largest error of the product, relative to the spread of its elements (sqrt(n) for N(0,1)
# operands), that rounding explains: bf16/fp16 outputs round to 8/11 significant bits and TF32 rounds
# the inputs to 11; fp32 and fp64 accumulate only. A wrong element (a flipped exponent bit, a stuck
# lane) is orders of magnitude above these.
TOLERANCE = {"bf16": 3e-2, "fp16": 1e-2, "tf32": 1e-2, "fp32": 1e-4, "fp64": 1e-10}
CHECK_ROWS = 4


def check_product(torch, a, b, product, dtype_name, rows=CHECK_ROWS, seed=1):
    """Is `product` a @ b? Two references in fp64 on the CPU, neither the GEMM under test: Freivalds'
    projection of the whole product (product @ x against a @ (b @ x) for a random +-1 vector x) and
    `rows` sampled rows computed exactly. -> {ok, error, tolerance, reason}."""
    big_a, big_b, got = a.double().cpu(), b.double().cpu(), product.double().cpu()
    n = big_a.shape[1]
    tolerance = TOLERANCE[dtype_name]
    if not bool(torch.isfinite(got).all()):
        return {"ok": False, "error": float("inf"), "tolerance": tolerance, "reason": "non-finite values"}
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 2, (big_b.shape[1],), generator=generator).double() * 2 - 1
    projected = float((got @ x - big_a @ (big_b @ x)).abs().max()) / n
    picked = torch.randint(0, big_a.shape[0], (rows,), generator=generator)
    sampled = float((got[picked] - big_a[picked] @ big_b).abs().max()) / n**0.5
    error = max(projected, sampled)
    ok = error <= tolerance
    reason = "" if ok else "differs from the fp64 reference by %.3g (tolerance %.3g)" % (error, tolerance)
    return {"ok": ok, "error": error, "tolerance": tolerance, "reason": reason}


def checksum(torch, product):
    """The product's bits as an integer below 2**53 (exact in a Float64 column): equal products of
    one seeded GEMM give equal checksums, bit for bit."""
    raw = product.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()
    return int.from_bytes(hashlib.blake2b(raw, digest_size=8).digest(), "big") & ((1 << 53) - 1)


def corrupt(torch, product):
    """Fault injection (tests, the lab's `sdc` node): one element made wrong, as a flipped bit would."""
    flat = product.view(-1)
    flat[flat.numel() // 3] += 100.0 * (float(product.abs().max()) + 1.0)


def gemm_burst(
    torch, device, dtype_name, n, iterations, warmup, rest_seconds=0.0, check=False, inject_error=False
):
    """Median TFLOP/s of `iterations` single GEMMs after `warmup` untimed ones; with `check`, the last
    product is checked against the fp64 reference and its checksum returned (`inject_error` corrupts
    it first, between compute and check).

    A burst starts from a rested GPU: back-to-back bursts heat it and pull it under its power cap
    (measured on an H200: 775, 736, 711 TFLOP/s bf16 for three bursts without rest), which is what the
    sustained run measures, not the burst. `rest_seconds` of idle come first."""
    timer = Timer(torch, device)
    _set_tf32(torch, dtype_name == "tf32")
    a, b = _operands(torch, device, dtype_name, n)
    out = torch.empty_like(a)
    timer.sync()
    if rest_seconds > 0:
        time.sleep(rest_seconds)
    for _warmup in range(warmup):
        torch.matmul(a, b, out=out)
    timer.sync()
    samples = [timer.time_ms(lambda: torch.matmul(a, b, out=out)) for _iteration in range(iterations)]
    flops = 2.0 * n**3
    tflops = [flops / (ms / 1000.0) / 1e12 for ms in samples if ms > 0]
    result = {"dtype": dtype_name, "n": n, "tflops": statistics.median(tflops), "samples_tflops": tflops}
    if check:
        if inject_error:
            corrupt(torch, out)
        result["check"] = check_product(torch, a, b, out, dtype_name)
        result["checksum"] = checksum(torch, out)
    return result


def gemm_sustained(torch, device, dtype_name, n, seconds, sampler=None, sample_every=2.0):
    """Back-to-back GEMMs for at least `seconds`; TFLOP/s over the whole run. `sampler()` is called
    about every `sample_every` seconds while it runs (to read clock event reasons, power, clocks)."""
    timer = Timer(torch, device)
    _set_tf32(torch, dtype_name == "tf32")
    a, b = _operands(torch, device, dtype_name, n)
    out = torch.empty_like(a)
    torch.matmul(a, b, out=out)
    timer.sync()
    samples, count, batch = [], 0, 10
    started = last_sample = time.perf_counter()
    while True:
        for _gemm in range(batch):
            torch.matmul(a, b, out=out)
        count += batch
        timer.sync()
        now = time.perf_counter()
        if sampler is not None and now - last_sample >= sample_every:
            samples.append(sampler())
            last_sample = now
        if now - started >= seconds:
            break
    elapsed = time.perf_counter() - started
    return {
        "dtype": dtype_name,
        "n": n,
        "gemms": count,
        "seconds": elapsed,
        "tflops": 2.0 * n**3 * count / elapsed / 1e12,
        "samples": samples,
    }


def fft_ms(torch, device, points, iterations, warmup):
    """Median ms of a complex64 FFT of `points` points."""
    timer = Timer(torch, device)
    generator = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(points, device=device, dtype=torch.complex64, generator=generator)
    for _warmup in range(warmup):
        torch.fft.fft(x)
    timer.sync()
    return statistics.median(timer.time_ms(lambda: torch.fft.fft(x)) for _iteration in range(iterations))
