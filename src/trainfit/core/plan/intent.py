"""From what a user asks for (an intent) and the hardware to the TrainingSetup that runs.

The one place that fills in what the user left open: the device (the hardware's accelerator),
the GPU count (all of them), the precision (hardware_rules' 16-bit type with the method's rule),
LoRA settings for LoRA methods, NF4 for QLoRA, the DPO reference. `estimate`, `cloud`, `train`
(precision: auto) and the planner all call it, so the same question gets the same setup.
"""

from __future__ import annotations

from typing import Any

from trainfit.core.plan.hardware_rules import half_type
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import (LoraSettings, TrainingSetup, default_precision, method_trains_adapters,
                                 parse_method)


def precision_for(hardware: HardwareProfile | None, device: str, *, method: str, has_lora: bool) -> str:
    """The default precision for a method on a device (see core.setup.default_precision)."""
    if hardware is None:
        half = None if device == "cpu" else "bf16"
    else:
        half = half_type(hardware, device)
    frozen = has_lora or method in ("lora", "qlora", "inference")
    return default_precision(frozen_base=frozen, half=half, on_cpu=device == "cpu")


def resolve_setup(hardware: HardwareProfile | None, method: str = "full", *, lora: LoraSettings | None = None,
                  precision: str | None = None, device: str | None = None, num_gpus: int | None = None,
                  quant: str | None = None, dpo_reference: str | None = None, **knobs: Any) -> TrainingSetup:
    """A complete TrainingSetup: the given knobs, and the defaults above for the rest.

    `knobs` are any other TrainingSetup fields (micro_batch, seq_len, optimizer, ...).
    """
    method = parse_method(method)
    device = device or (hardware.accelerator if hardware is not None else "cpu")
    if num_gpus is None:
        num_gpus = max(1, hardware.gpu_count) if hardware is not None and device != "cpu" else 1
    if "num_nodes" not in knobs and hardware is not None and device != "cpu" and hardware.node_count > 1:
        # the fewest of the hardware's nodes that hold num_gpus (core/machines/multinode_spec.py)
        knobs["num_nodes"] = min(hardware.node_count, -(-num_gpus // max(1, hardware.gpus_per_node)))
    if lora is None and method_trains_adapters(method, lora_given=False):
        lora = LoraSettings()
    if not method_trains_adapters(method, lora_given=lora is not None):
        lora = None
    if quant is None:
        quant = "nf4-dq" if method == "qlora" else "none"
    if dpo_reference is None:
        dpo_reference = "lora-base" if method == "dpo" and lora is not None else "separate"
    if precision is None or precision == "auto":
        precision = precision_for(hardware, device, method=method, has_lora=lora is not None)
        if quant != "none" and precision == "fp32":
            # 4/8-bit weights are de-quantised into a 16-bit compute type (bitsandbytes)
            precision = (half_type(hardware, device) if hardware is not None else None) or "bf16"
    return TrainingSetup(method=method, precision=precision, lora=lora, quant=quant, num_gpus=num_gpus,  # type: ignore[arg-type]
                         device=device, dpo_reference=dpo_reference, **knobs)  # type: ignore[arg-type]
