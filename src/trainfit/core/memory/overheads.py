"""Margins on top of the tensor peak, and what each device offers.

None of these are tensors, so a live-tensor counter (or torch.cuda.max_memory_allocated) does not
see them; nvidia-smi and the OOM killer do. Figures are typical values, stated as assumptions:

* CUDA context: created by the driver on first use; with lazy module loading (CUDA >= 11.7,
  default in PyTorch wheels) about 300-600 MiB depending on the GPU generation (PyTorch forum
  and docs "CUDA semantics"; NVIDIA CUDA C Programming Guide, "Lazy Loading").
* cuBLAS workspace: PyTorch's default CUBLAS_WORKSPACE_CONFIG=:4096:8 -> 32 MiB per handle,
  plus cuDNN / SDPA workspaces; we count 64 MiB.
* Caching allocator fragmentation: reserved - allocated is typically 5-15 % of the peak during
  training (ZeRO paper, section 3.2: OOM with >30 % free in the worst case); we count 10 % for
  training, 5 % for inference.
* NCCL: per-peer channel buffers (NCCL_BUFFSIZE 4 MiB x channels x peers) and its own CUDA
  streams; ~ 300 MiB per GPU for a single-node job.
* Apple MPS: Metal's recommendedMaxWorkingSetSize, 2/3 of unified memory up to 36 GiB and 3/4
  above (core.hardware_spec.metal_working_set_bytes, where the reported values are cited).
* CPU: the PyTorch + transformers runtime itself (~ 600 MiB resident) and malloc fragmentation.
"""

from __future__ import annotations

from trainfit.core.memory_types import MemoryComponent
from trainfit.core.profile import HardwareProfile

MIB = 1024**2
GIB = 1024**3

# Context size by GPU generation (architecture names as in the GPU catalog).
_CONTEXT_MIB = {
    "pascal": 300, "volta": 350, "turing": 350, "ampere": 450, "ada": 450, "hopper": 550,
    "blackwell": 600, "cdna2": 400, "cdna3": 450, "rdna2": 350, "rdna3": 350,
}
_CONTEXT_DEFAULT_MIB = {"cuda": 450, "rocm": 400, "xpu": 400, "mps": 0, "cpu": 0}


def margins(device: str, tensor_peak: float, *, architecture: str | None, num_gpus: int,
            training: bool) -> list[MemoryComponent]:
    """Named margins (in_tensor_peak=False) for one device of kind `device`."""
    out: list[MemoryComponent] = []
    frag = 0.10 if training else 0.05
    if device in ("cuda", "rocm", "xpu"):
        ctx = _CONTEXT_MIB.get((architecture or "").lower(), _CONTEXT_DEFAULT_MIB[device])
        out.append(MemoryComponent("cuda_context", ctx * MIB,
                                   f"driver context for {architecture or device}: ~{ctx} MiB (assumed)", False))
        out.append(MemoryComponent("framework_overhead", 64 * MIB,
                                   "cuBLAS (:4096:8 = 32 MiB) + cuDNN/SDPA workspaces: 64 MiB", False))
        if num_gpus > 1:
            out.append(MemoryComponent("nccl_buffers", 300 * MIB,
                                       "NCCL channel buffers and streams per GPU: ~300 MiB", False))
    elif device == "mps":
        out.append(MemoryComponent("framework_overhead", 256 * MIB,
                                   "Metal command buffers and MPS graph cache: ~256 MiB", False))
    else:
        out.append(MemoryComponent("framework_overhead", 600 * MIB,
                                   "PyTorch + transformers runtime resident in RAM: ~600 MiB", False))
    out.append(MemoryComponent("fragmentation", int(tensor_peak * frag),
                               f"allocator rounding and fragmentation: {int(frag * 100)} % of the tensor peak",
                               False))
    return out


def gpu_capacity(profile: HardwareProfile) -> int | None:
    """Per-GPU bytes training may use: total VRAM (the context is a component), or for Apple the
    Metal working-set share of unified memory. None when unknown."""
    if not profile.gpus:
        return None
    gpu = profile.gpus[0]
    if gpu.unified_memory or profile.accelerator == "mps":
        from trainfit.core.hardware_spec import metal_working_set_bytes

        # one rule (and its sources) for every command; None when the RAM size is unknown
        return metal_working_set_bytes(profile.memory.total_bytes or gpu.vram_total_bytes)
    totals = [g.vram_total_bytes for g in profile.gpus if g.vram_total_bytes]
    return min(totals) if totals else None


def cpu_capacity(profile: HardwareProfile) -> int | None:
    """Usable RAM, or None when the memory probe could not read it."""
    return profile.memory.usable_bytes
