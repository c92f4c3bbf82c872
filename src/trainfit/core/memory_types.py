"""Result types of the memory model (see DESIGN: "Memory JSON")."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def fits(self) -> bool | None:
        return None if self.capacity_bytes is None else self.total_bytes <= self.capacity_bytes


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
