"""TrainingStep: what every memory component of one training step reads, worked out once.

The component functions (weights, optimizer_states, gradients, saved_activations, loss,
transients) each take a TrainingStep and return their bytes; phases.py sums them per phase of the
step, the one place they are added up.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory.activations import dtype_bytes
from trainfit.core.memory.states import States
from trainfit.core.memory.stats import ModelStats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class TrainingStep:
    """One training step's model, setup and the quantities every component needs."""

    model: ModelSpec
    stats: ModelStats
    setup: TrainingSetup
    states: States  # weights, gradients and optimizer states per device (states.model_states)
    lora_where: dict[str, int] | None  # adapted modules per block by position; None: full training
    sequences: int  # sequences in a micro-batch through the model (DPO: chosen + rejected)
    tokens: int  # tokens in a micro-batch through each layer
    residual_bytes: int  # bytes per element of the residual stream
    compute_bytes: int  # bytes per element of the compute dtype (matmul outputs, logits)
    autocast: bool  # the layers run under autocast (mixed precision)

    @property
    def full(self) -> bool:
        """Every weight trains (no adapters)."""
        return self.lora_where is None

    @property
    def dpo(self) -> bool:
        return self.setup.method == "dpo"

    @property
    def num_layers(self) -> int:
        return self.model.num_layers


def training_step(model: ModelSpec, stats: ModelStats, setup: TrainingSetup, states: States,
                  lora_where: dict[str, int] | None) -> TrainingStep:
    """The TrainingStep of `setup` on `model`: DPO runs chosen and rejected sequences together."""
    sequences = setup.micro_batch * (2 if setup.method == "dpo" else 1)
    residual_bytes, compute_bytes, autocast = dtype_bytes(model, setup)
    return TrainingStep(model, stats, setup, states, lora_where, sequences, sequences * setup.seq_len,
                        residual_bytes, compute_bytes, autocast)
