"""Result types of the speed model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Bottleneck = Literal["compute", "memory bandwidth", "communication", "data loading", "offload", "framework overhead"]


@dataclass(frozen=True)
class Workload:
    """How much data one run processes. Either dataset_tokens or examples (x seq_len)."""

    examples: int | None = None
    dataset_tokens: int | None = None
    epochs: float = 1.0


@dataclass(frozen=True)
class SpeedEstimate:
    model_id: str
    device: str  # "cuda x2 (NVIDIA A100-SXM4-80GB)", "cpu (AMD EPYC)"
    compute_precision: str  # precision the matmuls run in ("bf16", "fp16", "fp32")
    micro_step_seconds: float  # one micro-batch forward+backward on one device
    step_seconds: float  # one optimizer step (global batch)
    tokens_per_second: float  # all devices together
    samples_per_second: float  # sequences (DPO: preference pairs; inference: prompts)
    step_flops: float  # FLOPs actually executed per optimizer step, all devices
    achieved_tflops_per_device: float
    mfu: float  # model FLOPs (6N + attention, no recompute) / (peak x devices x time)
    matmul_efficiency: float  # the efficiency the model assumed for the GEMMs
    seconds_by_part: dict[str, float]  # per optimizer step: compute, memory, overhead, optimizer, ...
    bottleneck: Bottleneck
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    total_seconds: float | None = None  # whole run (all epochs), None when no workload given
    # Inference only: time to the first token and per generated token.
    prefill_seconds: float | None = None
    decode_seconds_per_token: float | None = None
    notes: list[str] = field(default_factory=list)
