"""Margins on top of the tensor peak, and what each device offers.

None of these are tensors, so a live-tensor counter (or torch.cuda.max_memory_allocated) does not
see them; nvidia-smi and the OOM killer do. DeviceMemory.reserved_peak_bytes gives what
torch.cuda.max_memory_reserved shows (the tensor peak plus the margins inside the caching
allocator's pool); `total_bytes` is what nvidia-smi shows.

* CUDA context: created by the driver on first use. Since CUDA 11.7 with lazy module loading
  (PyTorch sets CUDA_MODULE_LOADING=LAZY since 1.13, pytorch/pytorch#86509) a bare context is
  about 250-430 MiB: 274 MiB vs 636 MiB eager in that PR's test; "~300MB ... before CUDA 11.7 ...
  >1000MB" (ptrblck, pytorch/pytorch#107667); 256 MiB on an RTX 3090 with torch 2.7.1+cu128
  (invoke-ai/InvokeAI#9413); 426 MiB on an RTX 6000 Ada with torch 2.10+cu130
  (unslothai/unsloth-zoo#1053). Training loads more kernels lazily (cuBLASLt, attention, NCCL), so
  the per-generation figures below sit at the top of that range. Eager loading (CUDA < 11.7 or
  CUDA_MODULE_LOADING=EAGER) is 2-4x larger and is not modelled.
* cuBLAS workspace: PyTorch's default CUBLAS_WORKSPACE_CONFIG=:4096:8 -> 32 MiB per handle,
  plus cuBLASLt / cuDNN / SDPA workspaces; we count 64 MiB. PyTorch allocates these through the
  caching allocator (CublasHandlePool.cpp), so they are inside the reserved pool.
* Caching allocator slack (reserved - allocated at the peak): blocks > 1 MiB come from 20 MiB
  segments or cudaMalloc rounded to 2 MiB, and freed blocks are cached and split rather than
  returned ("CUDA semantics: memory management", PyTorch docs), so transient tensors of varying
  size leave unusable gaps. Measured from published pairs of peak allocated and peak
  nvidia-smi / reserved of the same run (bench/data/published_memory.yaml,
  bench/results/published_memory.md, "Allocator slack"). One GPU: 5-42 %, median 25 % in the
  fms-acceleration A100 reference runs (HF Trainer, 25 runs: SantaCoder, Mistral 7B, Mixtral,
  Llama 2 70B and the held-out PowerLM-3B; 15 % from the first 17) -> 25 %. FSDP full shard / ZeRO-3,
  where every layer's parameters are gathered and freed each step: median 26 % of the first 15 runs,
  32 % of the 32 published now (12 and 24 % in Answer.AI's fsdp_qlora benchmarks; 26-35 % in
  meta-llama/llama-cookbook#41) -> 30 %.
  Inference: 5 % (one forward pass of steady shapes). This is the slack of a run with room to
  spare, what nvidia-smi shows; it is not what a run needs (next item).
* The slack of a full fine-tune also spans phases: the forward and backward free their activations
  into the cache, and the gradients and the optimizer step's temporaries (parameter-shaped, in
  other sizes) are mostly laid out beside those cached blocks rather than in them. So with room to
  spare the pool holds at least the resident states plus both phases' transients
  (`phase_pool_bytes`), and the slack is the larger of that excess and the share above. Evidence:
  the fms-acceleration Mistral 7B full fine-tune on 2 GPUs has the same allocated peak (its
  optimizer step) at batch 2 and 4, yet nvidia-smi shows 9 GiB more at batch 4, about what its
  activations grow by; a share of the peak cannot tell them apart. The allocator replay
  (bench/meta_trace.py) gives 40.4 % for a Llama 3.2 3B full fine-tune (this pool: 38.4 %), but
  6.5 % for Mistral 7B full at batch 4 (this pool: 15.4 %, under the flat share): it is the
  reserve of a run with room to spare, cut like the rest under pressure (next item).
* Under memory pressure the slack shrinks: when cudaMalloc fails, the caching allocator frees every
  cached segment that holds no live block and retries (CUDACachingAllocator.cpp,
  release_cached_blocks; counted in memory_stats()["num_alloc_retries"]), so only the gaps inside
  segments that still hold live tensors remain. Replaying twelve full-size training steps through the
  allocator's rules (bench/meta_trace.py, "least capacity") gives the least memory each run fits
  in: 0.7-15.5 % above its allocated peak, median 2.4 %, at most 5 % in 10 of 12. The fit verdict
  uses 5 % (`required_bytes`); published runs that fit within 2 GiB of their card (Answer.AI's
  24 GB QLoRA runs, LitGPT's 40 GB resource tables) are then no longer "does not fit".
* NCCL: per-channel, per-peer buffers for each protocol and its own CUDA streams, allocated by NCCL
  itself, outside the pool; "linearly tied to the number of channels" (NVIDIA/nccl#986). Measured
  with PyTorch on 4x A100 with NVLink after one all-reduce: 544 MB per GPU for a 2-GPU group, 688 MB
  for larger ones (NVIDIA/nccl#964) -> 519 / 656 MiB. PCIe cards open fewer channels, so this is
  their upper side; a job with several process groups pays it per group (not modelled).
* Apple MPS: Metal's recommendedMaxWorkingSetSize, 2/3 of unified memory up to 36 GiB and 3/4
  above (core.machines.hardware_spec.metal_working_set_bytes, where the reported values are cited).
* CPU: the PyTorch + transformers runtime itself (~ 600 MiB resident) and malloc fragmentation
  (10 % of the tensor peak, SLACK_HOST; MPS too: not measured yet). Neither gives memory back on
  a failed allocation the way the caching allocator does, so the verdict needs their whole total.
"""

from __future__ import annotations

from trainfit.core.memory.paged_states import spill_text
from trainfit.core.memory_types import DeviceMemory, MemoryComponent, spillable_bytes
from trainfit.core.machines.profile import HardwareProfile

MIB = 1024**2
GIB = 1024**3

# Context size by GPU generation (architecture names as in the GPU catalog).
_CONTEXT_MIB = {
    "pascal": 300, "volta": 350, "turing": 350, "ampere": 450, "ada": 450, "hopper": 550,
    "blackwell": 600, "cdna2": 400, "cdna3": 450, "rdna2": 350, "rdna3": 350,
}
# NCCL's own buffers per GPU, one process group (NVIDIA/nccl#964, 4x A100 NVLink: 544 / 688 MB).
NCCL_TWO_GPUS_MIB = 519
NCCL_MORE_GPUS_MIB = 656
_CONTEXT_DEFAULT_MIB = {"cuda": 450, "rocm": 400, "xpu": 400, "mps": 0, "cpu": 0}


# Caching-allocator slack as a share of the tensor peak (published runs, see above).
SLACK_TRAINING = 0.25
SLACK_TRAINING_SHARDED = 0.30  # ZeRO-3 / FSDP full shard: per-layer gather and free every step
SLACK_INFERENCE = 0.05
SLACK_HOST = 0.10  # CPU malloc / Metal heap fragmentation in training: not measured, unchanged from before
SLACK_UNDER_PRESSURE = 0.05  # what is left once the allocator has freed its cache and retried
POOLED_DEVICES = ("cuda", "rocm", "xpu")  # devices with PyTorch's caching allocator


def slack_fraction(*, training: bool, zero_stage: int = 0, device: str = "cuda") -> float:
    """Reserved-over-allocated slack of the caching allocator (or the host allocator's
    fragmentation on CPU / MPS), as a share of the tensor peak."""
    if not training:
        return SLACK_INFERENCE
    if device not in POOLED_DEVICES:
        return SLACK_HOST
    return SLACK_TRAINING_SHARDED if zero_stage >= 3 else SLACK_TRAINING


# Phases of a training step (core.memory.estimate) whose transients the cache keeps apart.
ACTIVATION_PHASES = ("forward", "loss backward", "layer backward", "reference forward")
STEP_PHASES = ("optimizer step", "backward end")


def phase_pool_bytes(phases: dict[str, float], *, resident: float) -> float:
    """The caching allocator's pool with room to spare when the forward/backward's freed blocks are
    not reused by the gradients and optimizer temporaries: `resident` (states alive in every phase)
    plus the transient of each phase group."""
    activation = max(phases[k] for k in ACTIVATION_PHASES)
    step = max(phases[k] for k in STEP_PHASES)
    return activation + step - resident


def margins(device: str, tensor_peak: float, *, architecture: str | None, num_gpus: int,
            training: bool, zero_stage: int = 0, phase_pool: float = 0.0) -> list[MemoryComponent]:
    """Named margins (in_tensor_peak=False) for one device of kind `device`. `zero_stage` >= 3
    (parameters sharded and gathered per layer) raises the allocator slack on multi-GPU runs;
    `phase_pool` (phase_pool_bytes) is the least the caching allocator holds free-running."""
    out: list[MemoryComponent] = []
    frag = slack_fraction(training=training, zero_stage=zero_stage if num_gpus > 1 else 0, device=device)
    if device in POOLED_DEVICES:
        ctx = _CONTEXT_MIB.get((architecture or "").lower(), _CONTEXT_DEFAULT_MIB[device])
        out.append(MemoryComponent("cuda_context", ctx * MIB,
                                   f"driver context for {architecture or device}: ~{ctx} MiB (lazy module loading)",
                                   False))
        out.append(MemoryComponent("framework_overhead", 64 * MIB,
                                   "cuBLAS (:4096:8 = 32 MiB) + cuDNN/SDPA workspaces: 64 MiB", False))
        if num_gpus > 1:
            nccl = NCCL_TWO_GPUS_MIB if num_gpus == 2 else NCCL_MORE_GPUS_MIB
            out.append(MemoryComponent("nccl_buffers", nccl * MIB,
                                       f"NCCL channel buffers and streams per GPU: ~{nccl} MiB", False))
    elif device == "mps":
        out.append(MemoryComponent("framework_overhead", 256 * MIB,
                                   "Metal command buffers and MPS graph cache: ~256 MiB", False))
    else:
        out.append(MemoryComponent("framework_overhead", 600 * MIB,
                                   "PyTorch + transformers runtime resident in RAM: ~600 MiB", False))
    slack = tensor_peak * frag
    what = "caching allocator slack (reserved - allocated)" if device != "cpu" else "malloc fragmentation"
    what = f"{what}: {int(round(frag * 100))} % of the tensor peak"
    if device in POOLED_DEVICES and training and phase_pool - tensor_peak > slack:
        slack = phase_pool - tensor_peak
        what = ("caching allocator slack (reserved - allocated): the blocks the forward and backward left "
                "cached, beside the gradients and optimizer temporaries laid out after them "
                f"({100 * slack / tensor_peak:.0f} % of the tensor peak)")
    if device in POOLED_DEVICES and slack > SLACK_UNDER_PRESSURE * tensor_peak:
        what += f" with room to spare; {int(round(SLACK_UNDER_PRESSURE * 100))} % survives its free-and-retry"
    out.append(MemoryComponent("fragmentation", int(slack), what, False))
    return out


def required_bytes(device: str, total_bytes: int, components: list[MemoryComponent]) -> int:
    """The least a device must offer for the run: `total_bytes` with the caching allocator's
    free-running slack cut to what survives its free-and-retry (SLACK_UNDER_PRESSURE of the tensor
    peak), and without managed memory the driver can evict to CPU RAM (SPILLABLE). Devices without
    the caching allocator need their whole total."""
    if device not in POOLED_DEVICES:
        return total_bytes
    peak = sum(c.bytes for c in components if c.in_tensor_peak)
    slack = sum(c.bytes for c in components if c.name == "fragmentation" and not c.in_tensor_peak)
    return int(total_bytes - spillable_bytes(components) - slack + min(slack, SLACK_UNDER_PRESSURE * peak))


def under_pressure_text(device: DeviceMemory) -> str:
    """Why a device that fits only under pressure (DeviceMemory.fits_under_pressure) still fits, and
    what it costs: one sentence for estimate and plan."""
    if device.spilled_bytes:
        return spill_text(device)
    return (f"with room to spare the caching allocator would reserve {device.total_bytes / GIB:.2f} GiB of the "
            f"{device.capacity_bytes / GIB:.2f} GiB card, so near the limit it frees its cache and retries "
            "(slower steps; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces it)")


def gpu_capacity(profile: HardwareProfile) -> int | None:
    """Per-GPU bytes training may use: total VRAM less what the driver keeps (the context is a
    component), or for Apple the Metal working-set share of unified memory. None when unknown."""
    if not profile.gpus:
        return None
    gpu = profile.gpus[0]
    if gpu.unified_memory or profile.accelerator == "mps":
        from trainfit.core.machines.hardware_spec import metal_working_set_bytes

        # one rule (and its sources) for every command; None when the RAM size is unknown
        return metal_working_set_bytes(profile.memory.total_bytes or gpu.vram_total_bytes)
    # The driver's own share of the total is never allocatable (A100 80GB: 81920 - 763 MiB, the
    # "total capacity of 79.25 GiB" in PyTorch's out-of-memory message).
    totals = [g.vram_total_bytes - (g.vram_reserved_bytes or 0) for g in profile.gpus if g.vram_total_bytes]
    return min(totals) if totals else None


def cpu_capacity(profile: HardwareProfile) -> int | None:
    """Usable RAM, or None when the memory probe could not read it."""
    return profile.memory.usable_bytes
