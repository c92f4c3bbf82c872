"""Result types of the memory model (see DESIGN: "Memory JSON")."""

from __future__ import annotations

from dataclasses import dataclass, field

# Margins that live inside PyTorch's CUDA caching allocator, so torch.cuda.max_memory_reserved sees
# them: the cuBLAS / cuBLASLt workspaces are allocated through it (CublasHandlePool.cpp
# getNewWorkspace -> CUDACachingAllocator) and the slack is, by definition, reserved - allocated.
# The driver context and NCCL's own cudaMalloc'd channel buffers are outside it: only nvidia-smi
# (and the OOM) sees those.
IN_ALLOCATOR_POOL = ("framework_overhead", "fragmentation")
# Memory the driver may move off the card instead of failing: managed (unified) memory of
# bitsandbytes' paged optimizers (core.memory.paged_states). Shown by nvidia-smi while resident,
# outside the caching allocator, and not needed on the card for the run to fit.
SPILLABLE = ("paged_optimizer",)


def spillable_bytes(components: list[MemoryComponent]) -> int:
    """Bytes of the margins in SPILLABLE: what the driver may move to CPU RAM."""
    return sum(c.bytes for c in components if c.name in SPILLABLE and not c.in_tensor_peak)


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
    def spillable_bytes(self) -> int:
        return spillable_bytes(self.components)

    @property
    def spilled_bytes(self) -> int:
        """Managed memory that does not fit on the card beside the rest and waits in CPU RAM. The
        caching allocator keeps its cached blocks (the driver evicts managed pages for a cudaMalloc
        rather than fail it), so the spill is what the free-running total exceeds the card by."""
        if self.capacity_bytes is None:
            return 0
        return int(min(self.spillable_bytes, max(0, self.total_bytes - self.capacity_bytes)))

    @property
    def device_total_bytes(self) -> int:
        """What nvidia-smi (or the OS) shows for the process: total_bytes, or the card's capacity on a
        run that fits only under pressure (the allocator frees its cache and retries there instead of
        growing, or managed pages fill what the rest leaves)."""
        return int(self.capacity_bytes or 0) if self.fits_under_pressure else self.total_bytes

    def _outside_pool_bytes(self) -> int:
        """The margins neither in the tensor peak nor in the caching allocator's pool, managed memory
        aside: the driver context and NCCL's buffers."""
        return sum(c.bytes for c in self.components
                   if not c.in_tensor_peak and c.name not in IN_ALLOCATOR_POOL + SPILLABLE)

    @property
    def reserved_peak_bytes(self) -> int | None:
        """What torch.cuda.max_memory_reserved would show: what the device shows less the margins
        outside the caching allocator's pool (the driver context, NCCL's buffers, managed memory).
        None off the caching allocator (CPU, MPS)."""
        if not self.device.startswith("cuda"):
            return None
        fixed = self._outside_pool_bytes()
        free_running = self.total_bytes - fixed - self.spillable_bytes
        # At the card's limit the pool is what the card leaves: managed pages give way to it first.
        return min(free_running, self.device_total_bytes - fixed)

    @property
    def least_pool_bytes(self) -> int | None:
        """The least the caching allocator's pool must be allowed to reach for the run to complete
        (what torch.cuda.set_per_process_memory_fraction caps): needed_bytes less the margins
        outside the pool. The fit verdict rests on it; bench/cuda_memory.py --least-capacity
        measures it. None off the caching allocator (CPU, MPS)."""
        if not self.device.startswith("cuda"):
            return None
        return self.needed_bytes - self._outside_pool_bytes()


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
