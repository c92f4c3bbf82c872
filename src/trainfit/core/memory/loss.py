"""Loss: the logits and the loss's saved tensors and temporaries of a training step.

The loss backward (grad of log_softmax + grad of logits, 12 B x vocab per token for an fp32 loss)
happens while every saved activation is still alive, so its temporaries count at that phase.
"""

from __future__ import annotations

from trainfit.core.memory import loss_kernels
from trainfit.core.memory.loss_kernels import LossTerms
from trainfit.core.memory.step import TrainingStep


def loss_bytes(step: TrainingStep) -> LossTerms:
    """The loss's bytes for the micro-batch: kept from the forward to the loss backward, and the
    temporaries of the loss forward and of its backward (loss_kernels for the kernels a causal-LM
    loss can run; DPO's log-probabilities below)."""
    if not step.dpo:
        return loss_kernels.loss_terms(step.model, step.setup, step.tokens, head_trains=step.full)
    # TRL selective_log_softmax keeps the logits (fp32: for logsumexp; 16-bit: per-row
    # log_softmax outputs); its backward holds the gather grad, the per-row grads stacked
    # and the slice grad: 3 logits-sized tensors (calibrated on CPU, bench/memory_accuracy).
    vocab, tokens, compute_bytes = step.model.vocab_size, step.tokens, step.compute_bytes
    saved, forward, backward = compute_bytes * vocab, compute_bytes * vocab, 3 * compute_bytes * vocab
    return LossTerms(saved * tokens, forward * tokens, backward * tokens,
                     f"logits + loss: {tokens} tokens x vocab {vocab} (fp32 log_softmax, its grads)")
