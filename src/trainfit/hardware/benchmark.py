"""`--benchmark`: short measurements that the estimators can use instead of datasheet peaks.

- memory bandwidth: numpy copy of a large array, counted as read + write bytes (STREAM "Copy"
  convention, https://www.cs.virginia.edu/stream/ref.html)
- CPU matmul GFLOP/s: fp32 via numpy (2 n^3 FLOP per n x n matmul); bf16 via torch when torch is
  importable: a bf16 matmul where the CPU has bf16 instructions, else the rate of a bf16 training
  matmul under autocast (forward + backward), the emulated path training would take
- GPU matmul TFLOP/s and device-memory bandwidth: torch in a SUBPROCESS, so the profiling
  process never creates a CUDA context
- disk: sequential write + fsync + read of a larger file than the default profile uses
Each part is best-of-N (the least disturbed run); the whole stays under 30 s.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import subprocess
import sys
import time

from trainfit.core.machines.profile import BenchmarkInfo, CpuInfo, GpuInfo
from trainfit.hardware.sources import Sources

DISK_BYTES = 512 << 20
GPU_TIMEOUT_SECONDS = 20.0

_GPU_SCRIPT = r"""
import json, time, torch
dev = torch.device("cuda")  # ROCm builds also use the "cuda" device name
out = {"tflops": {}}
def timed(fn, reps):
    fn(); torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); best = min(best, time.perf_counter() - t0)
    return best
n = 8192
for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
    if name == "bf16" and not torch.cuda.is_bf16_supported():
        continue
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(n, n, device=dev, dtype=dtype); b = torch.randn(n, n, device=dev, dtype=dtype)
    out["tflops"][name] = 2 * n**3 / timed(lambda: a @ b, 5) / 1e12
    del a, b
x = torch.empty(1 << 28, dtype=torch.float32, device=dev); y = torch.empty_like(x)
out["bandwidth_gbps"] = 2 * x.numel() * 4 / timed(lambda: y.copy_(x), 10) / 1e9
print(json.dumps(out))
"""


def _timings(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _best(fn, reps: int) -> float:
    return min(_timings(fn, reps))


def memory_bandwidth_gbps(size_bytes: int = 256 << 20, reps: int = 5) -> float:
    import numpy as np

    src = np.ones(size_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    return 2 * size_bytes / _best(lambda: np.copyto(dst, src), reps) / 1e9


def cpu_fp32_rates(n: int = 2048, reps: int = 3) -> list[float]:
    """GFLOP/s of each of `reps` fp32 n x n matmuls (numpy's BLAS), after one warm-up."""
    import numpy as np

    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    a @ b  # warm-up: BLAS thread pool start
    return [2 * n**3 / t / 1e9 for t in _timings(lambda: a @ b, reps)]


def spread(rates: list[float]) -> float:
    """1 - median / best of repeated rates: 0 when every repeat ran as fast as the best one."""
    import statistics

    return 1.0 - statistics.median(rates) / max(rates)


def cpu_bf16_gflops(n: int = 2048, reps: int = 3) -> float:
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16)
    b = torch.randn(n, n, dtype=torch.bfloat16)
    a @ b
    return 2 * n**3 / _best(lambda: a @ b, reps) / 1e9


def cpu_autocast_bf16_gflops(tokens: int = 256, width: int = 512, reps: int = 3) -> float:
    """The rate of a bf16 training matmul under CPU autocast: forward (x W^T) plus the two
    backward matmuls, 6 x tokens x width^2 FLOP. Without native bf16 instructions the backward
    matmuls take an emulated path (measured ~1-4 GFLOP/s on an AVX2 EPYC against ~150 for fp32),
    so a square `a @ b` alone would misstate what training gets."""
    import torch

    x = torch.randn(tokens, width, requires_grad=True)
    w = torch.randn(width, width, requires_grad=True)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.linear(x, w)
        y.float().sum().backward()

    step()
    return 6 * tokens * width * width / _best(step, reps) / 1e9


# The shape at which torch's own training matmul is timed: a 1024-wide linear over 512 tokens, the
# middle of the widths (64..4096) and tokens per micro-batch (64..2048) CPU training runs.
TRAINING_GEMM_TOKENS = 512
TRAINING_GEMM_WIDTH = 1024
# ... and a narrow one (256 wide, same tokens): how fast the rate falls for thin matrices depends on
# the CPU and its kernels (a 2-core Xeon lost ~15 % at 256 wide, the reference EPYC ~4 %).
TRAINING_GEMM_NARROW_WIDTH = 256


def cpu_training_gemm_gflops(tokens: int = TRAINING_GEMM_TOKENS, width: int = TRAINING_GEMM_WIDTH,
                             reps: int = 3) -> float:
    """fp32 GFLOP/s of a training matmul as torch runs it: the forward x W^T and the input and
    weight gradients of one linear layer, 6 x tokens x width^2 FLOP. The numpy peak is another BLAS
    (OpenBLAS) on a square 2048^3 product; torch's GEMMs (oneDNN / MKL) reach a share of it that
    depends on the CPU and the libraries (0.8 on a 2-core AMD EPYC), so the step-time model is
    anchored on this rate where it is measured (core.speed.cpu)."""
    import torch

    x = torch.randn(tokens, width, requires_grad=True)
    w = torch.randn(width, width, requires_grad=True)
    g = torch.ones(tokens, width)

    def step():
        y = torch.nn.functional.linear(x, w)
        torch.autograd.grad(y, (x, w), g)  # gradients returned, not accumulated into .grad

    step()
    return 6 * tokens * width * width / _best(step, reps) / 1e9


def cpu_first_touch_ns_per_page(nbytes: int = 64 << 20, reps: int = 3) -> float:
    """Nanoseconds per 4 KiB page of writing a freshly allocated tensor, beyond writing a reused
    one: the page fault, the kernel's zeroing and the unmap on free. Tensors above glibc's largest
    mmap threshold (32 MiB) get fresh pages at every allocation, as a training step's vocabulary-
    sized logits and big gradients do (core.speed.cpu); 1.4-2.1 us per page in a Firecracker VM."""
    import torch

    elements = nbytes // 4
    reused = torch.empty(elements)
    reused.fill_(1.0)

    def fresh():
        t = torch.empty(elements)
        t.fill_(1.0)
        del t

    fresh()
    extra = max(0.0, _best(fresh, reps) - _best(lambda: reused.fill_(1.0), reps))
    return extra / (nbytes / 4096) * 1e9


STEP_RATE_FIELDS = ("cpu_fp32_training_gflops", "cpu_fp32_training_narrow_gflops", "cpu_first_touch_ns_per_page")


def cpu_step_rates(scale: float = 1.0) -> tuple[dict[str, float | None], dict[str, str]]:
    """({BenchmarkInfo field: value} for STEP_RATE_FIELDS: torch's training-matmul GFLOP/s wide and
    narrow, first-touch ns per page; reasons for those that are None)."""
    if importlib.util.find_spec("torch") is None:
        why = "torch not installed (pip install 'trainfit[train]')"
        return dict.fromkeys(STEP_RATE_FIELDS), dict.fromkeys(STEP_RATE_FIELDS, why)
    tokens = max(64, int(TRAINING_GEMM_TOKENS * scale))
    wide = round(cpu_training_gemm_gflops(tokens, max(64, int(TRAINING_GEMM_WIDTH * scale))), 1)
    narrow = round(cpu_training_gemm_gflops(tokens, max(16, int(TRAINING_GEMM_NARROW_WIDTH * scale)), reps=5), 1)
    touch = round(cpu_first_touch_ns_per_page(max(1 << 22, int((64 << 20) * scale))), 1)
    return dict(zip(STEP_RATE_FIELDS, (wide, narrow, touch))), {}


def cpu_dropout_ns_per_element(elements: int = 1 << 21, reps: int = 3) -> float:
    """Nanoseconds per element of a training-mode dropout (p 0.1) on an fp32 tensor: torch's CPU path
    draws a Bernoulli noise tensor from a random-number generator, then scales and multiplies, so it
    runs at the generator's rate (9-19 ns per element on a 2-core AMD EPYC), not at memory bandwidth."""
    import torch

    x = torch.randn(elements)
    torch.nn.functional.dropout(x, 0.1, training=True)
    return _best(lambda: torch.nn.functional.dropout(x, 0.1, training=True), reps) / elements * 1e9


def cpu_dropout_rate(scale: float = 1.0) -> tuple[float | None, str | None]:
    """(ns per element, None) or (None, why): what the model's own dropout costs on this CPU."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed (pip install 'trainfit[train]')"
    return round(cpu_dropout_ns_per_element(max(1 << 14, int((1 << 21) * scale))), 2), None


def cpu_bf16_rate(cpu: CpuInfo, scale: float = 1.0) -> tuple[float | None, str | None]:
    """(GFLOP/s, None) or (None, why): a bf16 matmul with native instructions (avx512_bf16 / amx /
    FEAT_BF16), else the autocast training-matmul rate, which is what bf16 training would get."""
    if importlib.util.find_spec("torch") is None:
        return None, "torch not installed (pip install 'trainfit[train]')"
    if cpu.flags.get("bf16") or cpu.flags.get("avx512_bf16") or cpu.flags.get("amx_bf16"):
        return round(cpu_bf16_gflops(max(128, int(2048 * scale))), 1), None
    return round(cpu_autocast_bf16_gflops(max(64, int(256 * scale)), max(64, int(512 * scale))), 2), None


def gpu_benchmark(timeout_s: float = GPU_TIMEOUT_SECONDS) -> tuple[dict[str, float], float | None, str | None]:
    try:
        done = subprocess.run([sys.executable, "-c", _GPU_SCRIPT], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {}, None, f"GPU benchmark timed out after {timeout_s:g} s"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {}, None, f"GPU benchmark failed: {last}"
    data = json.loads(done.stdout.strip().splitlines()[-1])
    return ({k: round(v, 1) for k, v in data["tflops"].items()}, round(data["bandwidth_gbps"], 1), None)


def run_benchmark(src: Sources, cpu: CpuInfo, gpus: list[GpuInfo], *, work_dir: str | None = None,
                  disk_bytes: int = DISK_BYTES, scale: float = 1.0) -> BenchmarkInfo:
    """All measurements; `scale` < 1 shrinks the problem sizes (tests)."""
    from trainfit.hardware import cpu_load
    from trainfit.hardware.cpu_load import FP32_REPEATS, judge

    t0 = time.perf_counter()
    reasons: dict[str, str] = {}
    watch = cpu_load.snapshot()  # the CPU part is judged by the load on its cores (cpu_load.judge)
    mem = round(memory_bandwidth_gbps(int((256 << 20) * scale)), 1)
    fp32_runs = cpu_fp32_rates(max(128, int(2048 * scale)), FP32_REPEATS)
    fp32 = round(max(fp32_runs), 1)
    bf16, why = cpu_bf16_rate(cpu, scale)
    if why:
        reasons["cpu_bf16_gflops"] = why
    dropout_ns, why = cpu_dropout_rate(scale)
    if why:
        reasons["cpu_dropout_ns_per_element"] = why
    step_rates, why_not = cpu_step_rates(scale)
    reasons.update(why_not)
    check = judge(cpu_load.window(watch), round(spread(fp32_runs), 3), 1)
    if not check.reliable:
        reasons["under_load"] = (f"CPU part measured under load: {check.reason}; not kept as this machine's rates "
                                 "(run it again when the machine is quiet)")
    gpu_tflops: dict[str, float] = {}
    gpu_bw = None
    cuda_like = [g for g in gpus if g.vendor in ("nvidia", "amd")]
    if not cuda_like:
        reasons["gpu_bandwidth_gbps"] = "no NVIDIA/AMD GPU to benchmark"
    elif importlib.util.find_spec("torch") is None:
        reasons["gpu_bandwidth_gbps"] = "torch not installed (pip install 'trainfit[train]')"
    else:
        gpu_tflops, gpu_bw, why = gpu_benchmark()
        if why:
            reasons["gpu_bandwidth_gbps"] = why
    read = write = None
    try:
        read, write = (round(v, 1) for v in src.disk_bench(work_dir or src.cwd, disk_bytes))
    except OSError as exc:
        reasons["disk_read_mbps"] = reasons["disk_write_mbps"] = f"disk test failed: {exc}"
    measured_at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return BenchmarkInfo(mem, fp32, bf16, gpu_tflops, gpu_bw, read, write,
                         round(time.perf_counter() - t0, 2), reasons, measured_at=measured_at,
                         cpu_dropout_ns_per_element=dropout_ns, load_check=check, **step_rates)


def benchmark_unavailable(reason: str) -> BenchmarkInfo:
    fields = ("memory_bandwidth_gbps", "cpu_fp32_gflops", "cpu_bf16_gflops", "gpu_bandwidth_gbps",
              "disk_read_mbps", "disk_write_mbps", "cpu_dropout_ns_per_element", *STEP_RATE_FIELDS)
    return BenchmarkInfo(None, None, None, {}, None, None, None, 0.0, {f: reason for f in fields})
