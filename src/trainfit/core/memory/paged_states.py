"""bitsandbytes' paged optimizers: which optimizer states live in managed (unified) memory.

bitsandbytes allocates a paged optimizer's state with cudaMallocManaged (hipMallocManaged on ROCm,
shared USM on XPU: csrc/pythonInterface.cpp cget_managed_ptr, reached from
functional.get_paged) when the parameter has at least 1e5 elements
(optim/optimizer.py, Optimizer8bit.get_state_buffer). A smaller parameter's states, and the 8-bit
optimizers' fp32 absmax (one per 256 values, torch.zeros), come from PyTorch's caching allocator
like any tensor.

Managed memory is outside that allocator, so torch.cuda.max_memory_allocated and
max_memory_reserved never include it; nvidia-smi shows the part resident on the card. When the
card runs short the driver evicts managed pages to CPU RAM instead of failing an allocation, so a
run whose paged states do not fit beside everything else still trains: the part that does not fit
(`DeviceMemory.spilled_bytes`) waits in RAM and crosses the host link at every optimizer step
(core.speed.predict). Evidence: torchtune's Llama 3.1 8B full fine-tune with PagedAdamW8bit on one
RTX 4090 (24 GB) logs a 18.9 GiB allocated peak, the model's figure without the 15 GiB of 8-bit
states (bench/published_memory.py, finding 25).
"""

from __future__ import annotations

from trainfit.core.memory_types import DeviceMemory
from trainfit.core.models.spec import ModelSpec
from trainfit.core.models.params import count_params, linear_layers, lora_targets
from trainfit.core.setup import TrainingSetup

GIB = 1024**3
PAGED_OPTIMIZERS = ("paged-adamw-8bit", "paged-adamw-32bit")
PAGED_DEVICES = ("cuda", "rocm", "xpu")  # bitsandbytes' managed allocations: CUDA, HIP, SYCL
PAGED_MIN_ELEMENTS = 100_000  # get_state_buffer: `p.numel() < 1e5` -> torch.zeros_like
# Paged bytes per element: two uint8 states (8-bit), or two fp32 states (32-bit). The 8-bit
# optimizers' absmax stays in the allocator.
PAGED_STATE_BYTES = {"paged-adamw-8bit": 2.0, "paged-adamw-32bit": 8.0}


def pages_states(setup: TrainingSetup) -> bool:
    """Does this run keep optimizer states in managed memory?"""
    return (setup.optimizer in PAGED_OPTIMIZERS and setup.device in PAGED_DEVICES
            and setup.method != "inference")


def paged_elements(spec: ModelSpec, setup: TrainingSetup, trainable: int) -> int:
    """Trained elements whose parameter tensor has at least PAGED_MIN_ELEMENTS (whole model)."""
    big = PAGED_MIN_ELEMENTS
    if setup.trains_adapters:
        r = setup.lora.rank if setup.lora else 0
        targets = setup.lora.target_modules if setup.lora else []
        # lora_A is r x in, lora_B is out x r: each is paged on its own size.
        return min(trainable, sum(x.count * sum(n for n in (r * x.in_features, r * x.out_features) if n >= big)
                                  for x in lora_targets(spec, targets) if not x.vision))
    pb = count_params(spec)
    n = 0
    for x in linear_layers(spec):
        if x.kind == "lm_head" and spec.tie_embeddings:
            continue  # the embedding's tensor, counted below
        if x.in_features * x.out_features >= big:
            n += x.count * x.in_features * x.out_features
        if x.bias and x.out_features >= big:
            n += x.count * x.out_features
    n += sum(e for e in (pb.embedding, pb.position_embedding) if e >= big)
    return min(trainable, n)


def paged_state_bytes(spec: ModelSpec, setup: TrainingSetup, trainable: int) -> float:
    """Bytes of optimizer state in managed memory, whole model (callers shard it like the rest)."""
    if not pages_states(setup):
        return 0.0
    return paged_elements(spec, setup, trainable) * PAGED_STATE_BYTES[setup.optimizer]


def paged_what(setup: TrainingSetup) -> str:
    per = "2 x 1 B" if setup.optimizer == "paged-adamw-8bit" else "2 x fp32"
    return (f"paged optimizer states ({per} per element of every parameter with >= 100k elements) in "
            "managed memory: outside PyTorch's allocator, evicted to CPU RAM when the card runs short")


def spill_text(device: DeviceMemory) -> str:
    """What a run whose paged states do not all fit on the card costs: one sentence."""
    return (f"{device.spilled_bytes / GIB:.2f} GiB of the {device.spillable_bytes / GIB:.2f} GiB of paged "
            "optimizer states wait in CPU RAM and cross the host link at every optimizer step (slower steps)")


def paged_note(device: DeviceMemory) -> str:
    """The estimate's note on a paged optimizer."""
    if device.spilled_bytes:
        return spill_text(device)
    if device.capacity_bytes is None:
        return (f"paged optimizer states ({device.spillable_bytes / GIB:.2f} GiB) are managed memory: "
                "the driver evicts to CPU RAM what does not fit on the card")
    return (f"paged optimizer states ({device.spillable_bytes / GIB:.2f} GiB) fit on the card beside the rest: "
            "none waits in CPU RAM")
