"""What went wrong in a training step: out of memory, a lost or poisoned device, a non-finite loss.

`classify(exc)` looks at an exception (and the exceptions it was raised from or during) by type
and by message and returns a Failure, or None for anything else (a bug, bad input: those are not
recovered from). The messages are the ones the backends really print (tests/train/test_recovery.py
holds one real message per backend, taken from published tracebacks):

out of memory (kind "oom") — the step asked for more memory than there is; a smaller micro-batch
or gradient checkpointing can make it fit, and the process's state is intact:
    cuda   torch.OutOfMemoryError "CUDA out of memory. Tried to allocate ..." (CUDACachingAllocator),
           "CUDA error: out of memory" (the driver), "CUBLAS_STATUS_ALLOC_FAILED" (cuBLAS workspace),
           "CUDNN_STATUS_ALLOC_FAILED" / cuDNN's NOT_SUPPORTED-for-workspace message (accelerate
           counts that one as an OOM too)
    hip    torch.OutOfMemoryError "HIP out of memory. Tried to allocate ..." (ROCm), "HIP error: out of memory"
    mps    RuntimeError "MPS backend out of memory (MPS allocated: ..." (a plain RuntimeError: the
           MPS allocator raises with TORCH_CHECK, and its text has no "out of memory." with a period,
           which is what accelerate's matcher missed, accelerate #4226)
    xpu    torch.OutOfMemoryError "XPU out of memory. Tried to allocate ...", and the Level Zero
           runtime's "UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY" RuntimeError
    cpu    RuntimeError "[enforce fail at alloc_cpu.cpp:...] ... DefaultCPUAllocator: can't allocate
           memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)" (Linux),
           "DefaultCPUAllocator: not enough memory" (Windows), Python's MemoryError

device failure (kind "device_lost") — the device, or this process's context on it, cannot be
trusted any more; nothing in device memory may be saved, and the process must not touch the
device again (a CUDA error is sticky: every later call fails):
    lost      "GPU is lost" (NVML), "GPU has fallen off the bus" (Xid 79), "UR_RESULT_ERROR_DEVICE_LOST"
    ecc       "uncorrectable ECC error encountered" (Xid 48)
    poisoned  "an illegal memory access was encountered", "unspecified launch failure",
              "device-side assert triggered", "an illegal instruction was encountered",
              "misaligned address", "the launch timed out and was terminated"

non-finite loss (kind "nonfinite") — only when something raised on it (autograd's anomaly mode
"returned nan values", a library's "loss is nan"); a NaN loss normally raises nothing and is
watched step by step instead (trainfit.train.recovery.precision.PrecisionPolicy).

No torch import here: the torch exception types are looked up only when torch is loaded already.
"""

from __future__ import annotations

import gc
import re
import sys
from dataclasses import dataclass
from typing import Literal

Kind = Literal["oom", "device_lost", "nonfinite"]


@dataclass(frozen=True)
class Failure:
    kind: Kind
    backend: str  # cuda | hip | mps | xpu | cpu | unknown (oom); lost | ecc | poisoned (device_lost); nonfinite
    message: str  # the first line of the exception's message, at most 300 characters
    exception_type: str

    def describe(self) -> str:
        what = {"oom": f"out of memory ({self.backend})", "device_lost": f"device failure ({self.backend})",
                "nonfinite": "non-finite loss"}[self.kind]
        return f"{what}: {self.exception_type}: {self.message}" if self.message else f"{what}: {self.exception_type}"


# (kind, backend, pattern) in the order they are tried: the first match wins.
_PATTERNS: tuple[tuple[Kind, str, re.Pattern[str]], ...] = tuple(
    (kind, backend, re.compile(pattern, re.IGNORECASE)) for kind, backend, pattern in (
        ("oom", "cuda", r"\bCUDA out of memory\b"),
        ("oom", "hip", r"\bHIP out of memory\b"),
        ("oom", "mps", r"\bMPS backend out of memory\b"),
        ("oom", "xpu", r"\bXPU out of memory\b"),
        ("oom", "xpu", r"UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|PI_ERROR_OUT_OF_DEVICE_MEMORY"),
        ("oom", "cpu", r"DefaultCPUAllocator: (can't allocate memory|not enough memory)"),
        ("oom", "cpu", r"\[enforce fail at alloc_cpu\.cpp"),
        ("oom", "cuda", r"\bCUDA error: out of memory\b|cudaErrorMemoryAllocation"),
        ("oom", "hip", r"\bHIP error: out of memory\b|hipErrorOutOfMemory"),
        ("oom", "cuda", r"CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"),
        ("oom", "cuda", r"CUDNN_STATUS_NOT_SUPPORTED\. This error may appear if you passed in a non-contiguous input"),
        ("device_lost", "ecc", r"uncorrectable ECC error"),
        ("device_lost", "lost", r"\bGPU is lost\b|GpuIsLost|fallen off the bus|UR_RESULT_ERROR_DEVICE_LOST|"
                                r"PI_ERROR_DEVICE_LOST|hipErrorDeviceLost|device (has been )?lost"),
        ("device_lost", "poisoned", r"an illegal memory access was encountered|unspecified launch failure|"
                                    r"device-side assert triggered|an illegal instruction was encountered|"
                                    r"misaligned address|the launch timed out and was terminated"),
        ("nonfinite", "nonfinite", r"returned nan values|\bloss is (nan|inf)\b|non-finite loss"),
    ))


def _torch_oom_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "OutOfMemoryError", None) if torch is not None else None


def _chain(exc: BaseException, limit: int = 8) -> list[BaseException]:
    """exc and what it was raised from / during (a wrapper may carry the real failure inside)."""
    out, seen = [], set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(out) < limit:
        out.append(cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return out


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= 300 else line[:297] + "..."


def classify(exc: BaseException) -> Failure | None:
    """The Failure `exc` stands for, or None when it is none of the above."""
    from trainfit.errors import TrainfitError

    if isinstance(exc, (KeyboardInterrupt, SystemExit, TrainfitError)):
        return None  # the user's interrupt and trainfit's own errors are never "recovered" from
    oom_type = _torch_oom_type()
    for e in _chain(exc):
        text = str(e)
        for kind, backend, pattern in _PATTERNS:
            if pattern.search(text):
                return Failure(kind, backend, first_line(e), type(e).__name__)
        if isinstance(e, MemoryError):
            return Failure("oom", "cpu", first_line(e), type(e).__name__)
        if oom_type is not None and isinstance(e, oom_type):
            return Failure("oom", "unknown", first_line(e), type(e).__name__)
    return None


def is_oom(exc: BaseException) -> bool:
    f = classify(exc)
    return f is not None and f.kind == "oom"


def free_device_memory() -> None:
    """Return what the caches hold: Python garbage first (tensors that only a cycle still holds),
    then the device allocators' cached blocks. Safe to call on any machine; never initialises a
    device that is not in use yet."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:  # a failed device: nothing to free there
        pass
    for name in ("mps", "xpu"):
        backend = getattr(torch, name, None)
        try:
            if backend is not None and backend.is_available() and hasattr(backend, "empty_cache"):
                backend.empty_cache()
        except Exception:
            pass
