"""What the model's own dropout keeps for its backward (ModelSpec hidden/attention/embedding_dropout).

A dropout that runs in training keeps what its backward multiplies by:
* CUDA: the fused native_dropout keeps a bool mask, 1 B per element (ATen Dropout.cpp,
  is_fused_kernel_acceptable);
* CPU (and MPS, which ATen does not fuse either): the unfused path multiplies by a noise tensor of
  the input's dtype and keeps the noise.
Its output is a new tensor, so where the next op keeps its input (the probabilities' matmul with
v, T5's wo after a ReLU that keeps its own output) that op keeps one more copy.

Sites (transformers' modeling code): the hidden dropout runs on a block's attention output and on
its MLP output before each residual add (once per parallel falcon block, whose MLP output already
holds the attention's; T5 also on the feed-forward's inner activation and on the decoder's
cross-attention output); the embedding dropout once on the embeddings (T5: on both stacks' inputs
and final outputs); the attention dropout on the probabilities. SDPA's fused kernels on CUDA
(flash, memory-efficient) draw that mask from a Philox seed and keep nothing more; eager attention
keeps the mask and the dropped probabilities; on CPU, SDPA's fused kernel takes no dropout and its
math path runs instead.

Measured on CPU (GPT-2, transformers 5.24, torch 2.13: bytes saved with each dropout alone at 0.1
against none): hidden 2 sites x compute bytes per token and layer, embedding the residual dtype's
bytes, eager probabilities noise + dropped copy (fp32: 8 B per score, bf16: 4, autocast: 2, the
dropped copy taking the place of the 16-bit copy the matmul kept), SDPA's math path 12 B per score
(fp32 probabilities, noise and dropped copy at any precision) plus, at 16 bits, fp32 copies of q,
k and v in place of the 16-bit ones, less the fused kernel's logsumexp (tests/memory/test_model_dropout.py).

Off: LitGPT's models have no dropout modules, TRL's DPOTrainer disables dropout (DPOConfig
disable_dropout, default True), inference runs in eval mode. With a frozen base and no input
gradients (LoRA without checkpointing) the embeddings' output needs no gradient and its dropout
keeps nothing.
"""

from __future__ import annotations

from trainfit.core.models.spec import ModelSpec
from trainfit.core.setup import TrainingSetup


def runs(spec: ModelSpec, setup: TrainingSetup) -> bool:
    """Whether the model's dropout modules are active in this run at all."""
    return setup.method not in ("inference", "dpo") and setup.model_code != "litgpt"


def mask_bytes(setup: TrainingSetup, input_bytes: int) -> int:
    """ATen fuses dropout (bool mask) on CUDA / ROCm and XPU tensors only; CPU and MPS keep noise."""
    return input_bytes if setup.device in ("cpu", "mps") else 1


def hidden_sites(spec: ModelSpec) -> float:
    """Hidden-width dropouts per block (T5's decoder cross-attention spread over all blocks)."""
    if spec.capabilities.parallel_shares_hidden_dropout and spec.parallel_attention:
        return 1.0
    if spec.decoder_layers:
        return 2.0 + spec.decoder_layers / spec.num_layers
    return 2.0


def attentions_per_block(spec: ModelSpec) -> float:
    """Attention probabilities per block: one, plus T5's decoder cross-attention spread over all blocks."""
    return 1 + spec.decoder_layers / spec.num_layers


def block_bytes_per_token(spec: ModelSpec, setup: TrainingSetup, ffn_width: int, compute_bytes: int,
                          down_in: bool) -> float:
    """Per token and block: the hidden dropouts' masks, and T5's feed-forward dropout (mask, plus
    the copy wo keeps when the ReLU before it keeps its own output)."""
    if not (spec.hidden_dropout and runs(spec, setup)):
        return 0.0
    m = mask_bytes(setup, compute_bytes)
    total = hidden_sites(spec) * m * spec.hidden_size
    if spec.decoder_layers:
        copy = compute_bytes if down_in and spec.activation == "relu" and not spec.gated_mlp else 0
        total += (m + copy) * ffn_width
    return total


def embedding_sites(spec: ModelSpec) -> int:
    """Embedding-width dropouts per token: one, or T5's four (both stacks' inputs and outputs)."""
    return 4 if spec.decoder_layers else 1


def dropped_elements_per_token(spec: ModelSpec, setup: TrainingSetup, scores_materialised: bool) -> float:
    """Elements one forward draws a dropout mask for, per token (the speed model's count): every
    block's hidden dropouts, the embeddings', and the attention probabilities where they are a tensor
    (eager attention, SDPA's math path); fused SDPA kernels draw theirs inside the kernel."""
    if not runs(spec, setup):
        return 0.0
    total = 0.0
    if spec.hidden_dropout:
        total += spec.num_layers * hidden_sites(spec) * spec.hidden_size
        if spec.decoder_layers:
            total += spec.num_layers * spec.intermediate_size
    if spec.embedding_dropout:
        total += embedding_sites(spec) * spec.hidden_size
    if spec.attention_dropout and scores_materialised:
        total += spec.num_layers * attentions_per_block(spec) * spec.num_heads * setup.seq_len
    return total


def embedding_bytes_per_token(spec: ModelSpec, setup: TrainingSetup, residual_bytes: int) -> float:
    """The embedding dropout's mask, where the embeddings' output needs a gradient: full training,
    or input gradients switched on for checkpointing (PEFT / Trainer enable_input_require_grads)."""
    if not (spec.embedding_dropout and runs(spec, setup)):
        return 0.0
    if setup.method not in ("full", "pretrain") and setup.grad_checkpointing == "none":
        return 0.0
    return embedding_sites(spec) * mask_bytes(setup, residual_bytes) * spec.hidden_size


def attention_dropout_runs(spec: ModelSpec, setup: TrainingSetup) -> bool:
    return bool(spec.attention_dropout) and runs(spec, setup)


def sdpa_math_fallback(spec: ModelSpec, setup: TrainingSetup, kind: str) -> bool:
    """SDPA on CPU with attention dropout: the fused CPU kernel takes no dropout, the math path runs."""
    return kind == "sdpa" and setup.device == "cpu" and attention_dropout_runs(spec, setup)


def eager_scores_extra_bytes(spec: ModelSpec, setup: TrainingSetup, compute_bytes: int, mixed: bool) -> float:
    """Per score element of eager attention: the mask and the dropped copy the matmul keeps, less the
    16-bit copy of fp32 probabilities it kept before (autocast; HF's eager upcasts except GPT-2's)."""
    if not attention_dropout_runs(spec, setup):
        return 0.0
    copy_replaced = compute_bytes == 2 and (mixed or not spec.capabilities.eager_probs_in_input_dtype)
    return mask_bytes(setup, compute_bytes) + (0 if copy_replaced else compute_bytes)


MATH_SCORES_BYTES = 12  # fp32 probabilities, noise and dropped copy per score element


def math_core_extra_bytes(q_width: int, kv_width: int, heads: int, compute_bytes: int) -> float:
    """Per token and layer, SDPA's math path against the fused kernel's saved q, k, v, out and
    logsumexp: fp32 copies of 16-bit q, k and v, and no logsumexp."""
    upcast = (4 - compute_bytes) * (q_width + 2 * kv_width)
    return upcast - 4 * heads
