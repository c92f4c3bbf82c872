"""The logits term under the three ways the causal-LM loss meets the logits.

* standard: transformers' ForCausalLMLoss materialises batch x seq x vocab logits, upcasts them to
  fp32 and keeps log_softmax's output for backward (activations.loss_bytes_per_token); before
  transformers 4.49 it also copied the shifted logits, and some architectures skipped the upcast
  (TrainingSetup.logits_shift_copy, Runtime.legacy_loss_in_16bit). Under torch.compile
  the model's graph keeps the 16-bit logits instead, and two fp32 per token.
* fused: Liger-Kernel's fused linear cross-entropy (LigerFusedLinearCrossEntropyFunction,
  github.com/linkedin/Liger-Kernel src/liger_kernel/ops/fused_linear_cross_entropy.py, read
  2026-11-23). It never builds the whole logits: the BT tokens go through the lm_head in chunks
  of chunk = next_power_of_2(ceil(BT / ceil(V / H))) tokens (at most BT), so one chunk's logits
  are about BT x H elements; the cross-entropy kernel writes each chunk's gradient into the same
  buffer in place, and the gradients of the hidden states (BT x H, the input's dtype), of the
  lm_head weight (V x H, when it trains) and an fp32 loss per token are computed in the forward
  and kept for backward, which only scales them.
* chunked: torchtune's CEWithChunkedOutputLoss (torchtune/modules/loss/ce_chunked_output_loss.py,
  read 2026-11-27; pytorch/torchtune#1390). The model's forward applies the lm_head to CHUNKS = 8
  pieces of the tokens (TransformerDecoder.chunked_output) and returns the list of 16-bit logits;
  the loss upcasts one piece at a time to fp32 and runs cross_entropy on it. Nothing is
  recomputed: every piece's log_softmax output (fp32) is saved for the backward, so what chunking
  saves is the fp32 upcast of the whole logits, not the saved tensor. The recipes `del logits`
  before backward, which then holds one piece's fp32 gradients at a time, the hidden-state
  gradient filled piece by piece and a trained lm_head's gradient (three copies while the next
  piece's is summed in). With compile=True the recipes compile the loss too: each piece keeps its
  16-bit logits instead (TrainingSetup.torch_compile).
* chunked-16bit: LitGPT applies the lm_head to 128-token chunks (lm_head_chunk_size=128) and
  `chunked_cross_entropy` runs cross_entropy on each chunk in the logits' own dtype, with no fp32
  upcast (litgpt/utils.py, finetune/*.py): every chunk's logits and log_softmax output stay alive
  to the loss backward (2 x compute dtype x vocab per token), which then runs chunk by chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import TrainingSetup

CHUNKS = 8
LITGPT_CHUNK_TOKENS = 128


@dataclass(frozen=True)
class LossTerms:
    saved: float  # bytes kept from the forward to the loss backward
    forward: float  # transient bytes during the loss forward
    backward: float  # transient bytes during the loss backward
    what: str


def compiled_loss_bytes_per_token(a: int, v: int) -> tuple[float, float]:
    """(kept, backward grads) bytes per token of cross_entropy(logits.float()) under torch.compile:
    AOTAutograd's partition (Inductor's) keeps the `a`-byte logits themselves and two fp32 per token
    (max, log-sum-exp), never an fp32 copy, and the backward writes the logits' grad in their own
    dtype (read on CPU for one piece and for a whole compiled transformers Llama:
    bench/results/compiled_loss_cpu.md)."""
    return a * v + 8.0, a * v


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def liger_chunk_tokens(tokens: int, vocab: int, hidden: int) -> int:
    """Liger's chunk: bounds one chunk's logits to about tokens x hidden elements."""
    inc_factor = math.ceil(vocab / hidden)
    return min(_next_power_of_2(math.ceil(tokens / inc_factor)), tokens)


def chunked_chunk_tokens(tokens: int) -> int:
    return math.ceil(tokens / CHUNKS)


def loss_terms(spec: ModelSpec, setup: TrainingSetup, tokens: int, *, head_trains: bool) -> LossTerms:
    """Bytes of the logits + loss for `tokens` tokens of one micro-batch."""
    from trainfit.core.memory.activations import dtype_bytes, loss_bytes_per_token

    residual_bytes, compute_bytes, _ = dtype_bytes(spec, setup)
    vocab, hidden = spec.vocab_size, spec.hidden_size
    saved, fwd, bwd = loss_bytes_per_token(spec, setup)
    head_bytes = 4 if setup.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2
    head_grad = vocab * hidden * head_bytes if head_trains else 0.0
    if setup.loss == "fused":
        chunk = liger_chunk_tokens(tokens, vocab, hidden)
        kept = tokens * (residual_bytes * hidden + 4) + head_grad
        return LossTerms(kept, chunk * vocab * compute_bytes, 0.0,
                         f"fused linear cross-entropy (Liger): {chunk} of {tokens} tokens' logits at a time, "
                         "hidden-state grads (+ lm_head grad) kept from the forward")
    if setup.loss == "chunked":
        chunk = chunked_chunk_tokens(tokens)
        if setup.torch_compile:
            # torchtune compiles compute_cross_entropy with the model: each piece keeps its logits.
            kept, grads = compiled_loss_bytes_per_token(compute_bytes, vocab)
            fwd_bytes = tokens * kept
            what = "torch.compile keeps each piece's 16-bit logits and its log-sum-exp"
        else:
            # Forward: every piece's 16-bit logits (the list the model returns; the recipes `del` it
            # before backward) and, piece by piece, the saved fp32 log_softmax outputs, beside one
            # piece's fp32 upcast.
            kept, grads = saved, bwd
            fwd_bytes = tokens * (saved + compute_bytes * vocab) + chunk * (fwd - compute_bytes * vocab)
            what = "every piece's fp32 log_softmax kept for backward"
        # Backward, piece by piece (each piece's saved tensors are freed once its cross-entropy
        # backward has run): one piece's grads; then its logits' grad in the compute dtype and the
        # lm_head grad it makes (when the head trains). The head's weight is used once per piece, so
        # autograd sums its grads in an input buffer, out of place (a linear's weight grad is a
        # transposed view): from the second piece on, the sum so far, the new grad and their sum. The
        # hidden-state grad fills piece by piece. Measured on CPU, eager, fp32 and bf16:
        # tests/memory/test_dora_loss_vision.py.
        piece_grads = max(chunk * grads, chunk * (compute_bytes * vocab - kept) + head_grad,
                          3 * head_grad - 2 * chunk * kept)
        return LossTerms(tokens * kept, fwd_bytes - tokens * kept, piece_grads + tokens * residual_bytes * hidden,
                         f"chunked cross-entropy (torchtune): {CHUNKS} pieces of {chunk} tokens upcast one at a "
                         f"time; {what}")
    if setup.loss == "chunked-16bit":
        chunk = min(LITGPT_CHUNK_TOKENS, tokens)
        # Backward, one chunk at a time: the grads of its log_softmax and logits, in the compute dtype.
        return LossTerms(2 * compute_bytes * vocab * tokens, chunk * compute_bytes * vocab,
                         2 * chunk * compute_bytes * vocab,
                         f"16-bit chunked cross-entropy: {tokens} tokens' logits and log_softmax kept in "
                         f"{compute_bytes}-byte dtype, no fp32 upcast; backward {chunk} tokens at a time")
    if setup.torch_compile:
        # A compiled model's graph holds its loss: the logits it keeps are the very tensor the model
        # returns, whatever the release's upcasts and shifted copies.
        kept, grads = compiled_loss_bytes_per_token(compute_bytes, vocab)
        return LossTerms(tokens * kept, 0.0, tokens * grads,
                         f"logits + loss: {tokens} tokens x vocab {vocab} (torch.compile: the {compute_bytes}-byte "
                         "logits and "
                         "their log-sum-exp kept, no fp32 copy)")
    if runtime_of(setup).legacy_loss_in_16bit(spec):
        how = (f"{compute_bytes}-byte logits, their shifted copy and log_softmax (transformers < 4.49, "
               "no fp32 upcast)")
    elif runtime_of(setup).logits_shift_copy:
        how = "fp32 log_softmax, its grads; transformers < 4.49 copies the shifted fp32 logits"
    else:
        how = "fp32 log_softmax, its grads"
    return LossTerms(saved * tokens, fwd * tokens, bwd * tokens,
                     f"logits + loss: {tokens} tokens x vocab {vocab} ({how})")
