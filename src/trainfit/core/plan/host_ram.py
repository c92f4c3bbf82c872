"""Host RAM a training setting needs, checked against the machine it runs on (this machine, a
catalog machine, or a rented flavor's RAM from data/cloud.yaml).

Two peaks, one after the other, never added: while loading, from_pretrained materialises the
16-bit model in every training process on the node; once training, DeepSpeed's CPU offload holds
the optimizer states, fp32 master weights and gradients of every rank on the node (the memory
model's "cpu" device, its pinned staging buffers included). The loaded copy moves to the GPU (or
is partitioned) before the optimizer and its offloaded states are built, so the need is the
larger of the two. On a CPU or a unified-memory machine the model's memory is this RAM itself.
"""

from __future__ import annotations

from trainfit.core.memory_types import MemoryEstimate
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import TrainingSetup

LOADED_BYTES_PER_PARAM = 2  # the 16-bit state dict from_pretrained builds on the CPU


def processes_per_node(setup: TrainingSetup, hw: HardwareProfile) -> int:
    return max(1, setup.num_gpus // max(1, getattr(hw, "node_count", 1)))


def ram_is_the_device(setup: TrainingSetup, hw: HardwareProfile) -> bool:
    return setup.device == "cpu" or any(g.unified_memory for g in hw.gpus)


def loading_bytes(memory: MemoryEstimate, setup: TrainingSetup, hw: HardwareProfile) -> int:
    """RAM of the 16-bit copies loaded in the node's processes. A quantized (QLoRA) base is
    quantized shard by shard onto the GPU, with one shard on the host at a time: not counted."""
    if setup.quant != "none":
        return 0
    return LOADED_BYTES_PER_PARAM * memory.params_total * processes_per_node(setup, hw)


def offloaded_bytes(memory: MemoryEstimate) -> int:
    """The memory model's CPU device of an offloaded setting (0 without offload)."""
    if len(memory.devices) <= 1:
        return 0
    return sum(d.total_bytes for d in memory.devices if d.device == "cpu")


def host_ram_need_bytes(memory: MemoryEstimate, setup: TrainingSetup, hw: HardwareProfile) -> int:
    """RAM the training process(es) of one node hold at their peak (see the module doc)."""
    if ram_is_the_device(setup, hw):
        return memory.devices[0].total_bytes
    return max(offloaded_bytes(memory), loading_bytes(memory, setup, hw))


def host_ram_ratio(memory: MemoryEstimate, setup: TrainingSetup, hw: HardwareProfile) -> float:
    """Host need over the usable RAM (<= 1 fits); 0 where the RAM is the device (the device check
    covers it) or the RAM is unknown."""
    usable = hw.memory.usable_bytes
    if ram_is_the_device(setup, hw) or not usable:
        return 0.0
    return host_ram_need_bytes(memory, setup, hw) / usable
