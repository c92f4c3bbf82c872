"""Result types of the memory model (see DESIGN: "Memory JSON")."""

from __future__ import annotations

from dataclasses import dataclass, field

# Margins that live inside PyTorch's CUDA caching allocator, so torch.cuda.max_memory_reserved sees
# them: the cuBLAS / cuBLASLt workspaces are allocated through it (CublasHandlePool.cpp
# getNewWorkspace -> CUDACachingAllocator) and the slack is, by definition, reserved - allocated.
# The driver context and NCCL's own cudaMalloc'd channel buffers are outside it: only nvidia-smi
# (and the OOM) sees those.
IN_ALLOCATOR_POOL = ("framework_overhead", "fragmentation")


@dataclass(frozen=True)
class MemoryComponent:
    name: str  # weights, gradients, optimizer, master_weights, activations, logits, kv_cache,
    #            lora, quant_overhead, framework_overhead, fragmentation, cuda_context, ...
    bytes: int
    what: str  # one line: what it is and the formula used
    in_tensor_peak: bool  # True: counted by max_memory_allocated; False: a margin on top


@dataclass(frozen=True)
class DeviceMemory:
    device: str  # "cuda:0" (per GPU, all GPUs equal under data parallel), "cpu"
    tensor_peak_bytes: int
    total_bytes: int  # tensor peak + margins
    capacity_bytes: int | None  # what the hardware offers (usable), None when no hardware given
    components: list[MemoryComponent]
    # The least the device must offer: total_bytes less the allocator slack that the caching
    # allocator gives back when memory runs short (overheads.required_bytes); None: total_bytes.
    required_bytes: int | None = None

    @property
    def needed_bytes(self) -> int:
        return self.total_bytes if self.required_bytes is None else self.required_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.needed_bytes <= self.capacity_bytes

    @property
    def fits_under_pressure(self) -> bool:
        """Fits only because the allocator frees its cache and retries near the capacity."""
        return bool(self.fits) and self.total_bytes > (self.capacity_bytes or 0)

    @property
    def device_total_bytes(self) -> int:
        """What nvidia-smi (or the OS) shows for the process: total_bytes, or the card's capacity on a
        run that fits only under pressure (the allocator frees its cache and retries there instead of
        growing)."""
        return int(self.capacity_bytes or 0) if self.fits_under_pressure else self.total_bytes

    @property
    def reserved_peak_bytes(self) -> int | None:
        """What torch.cuda.max_memory_reserved would show: what the device shows less the margins
        outside the caching allocator's pool (the driver context, NCCL's buffers). None off the
        caching allocator (CPU, MPS)."""
        if not self.device.startswith("cuda"):
            return None
        outside_pool = sum(c.bytes for c in self.components if not c.in_tensor_peak and c.name not in IN_ALLOCATOR_POOL)
        return self.device_total_bytes - outside_pool


@dataclass(frozen=True)
class MemoryEstimate:
    model_id: str
    params_total: int
    params_trainable: int
    devices: list[DeviceMemory]
    notes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        verdicts = [d.fits for d in self.devices]
        if any(v is None for v in verdicts):
            return None
        return all(verdicts)
