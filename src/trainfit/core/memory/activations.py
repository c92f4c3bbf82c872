"""Activation memory of a training step: tensors autograd saves, per token and per layer.

Starting point: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models" (arXiv 2205.05198), s*b*h*(34 + 5*a*s/h) bytes per layer for a GPT block with 16-bit
activations and dropout. That form does not describe today's models, so the terms below follow
what transformers' modeling code and PyTorch's autograd actually save, tensor by tensor:

* RMSNorm (HF: x.to(fp32); pow; mean; rsqrt; mul; weight * y.to(dtype)) saves the fp32 input
  (4h), rsqrt (4 B/token) and, when the norm weight trains, the normalised tensor.
  LayerNorm (native op) saves its input plus mean and rstd (8 B/token).
* A linear saves its input only when its weight trains (autograd saves mat1 only if mat2
  requires grad). Under autocast every linear casts its fp32 input itself, so q, k and v keep
  three bf16 copies of the norm output; without autocast they share one tensor.
* SDPA / flash keep q, k, v, the output and a fp32 logsumexp (4 B per head per token); eager
  attention keeps the softmax probabilities b*heads*s^2 (fp32 softmax, plus its 16-bit copy
  when the compute dtype is 16-bit), k and v repeated to all heads (GQA), and a contiguous
  copy of the output.
* SwiGLU keeps gate, act(gate), up and their product (4 x ffn); GELU MLPs 2 x ffn.
* LoRA (PEFT) keeps each adapted module's (cast) input for dA, the r-wide A output for dB, and
  with dropout > 0 a bool mask plus the dropped copy per adapted module.
* DoRA (core/memory/dora.py): each adapted module's base and LoRA outputs per token.
* Loss (transformers ForCausalLMLoss): fp32 upcast of the logits, log_softmax output saved
  (4 B x vocab per token); its backward holds grad of log_softmax and grad of logits together
  with the saved output: 12 B x vocab per token.

* Falcon, GPTBigCode, BLOOM, T5 / mT5 and BERT / RoBERTa (attention_kind and the branches
  below): which SDPA path really runs (MQA falcon before transformers 5.25 and T5's trainable
  position bias fall back to the math path, which saves the scores like eager), T5's
  cross-attention and position bias,
  BLOOM's embedding LayerNorm, the MLM head of the encoders. Checked with the same counter on
  tiny models built from shipped config.json files (tests/models/test_architecture_memory.py).
  Qwen v1 (remote code, never run here) is estimated as the Llama-like block it is, with a
  fused c_attn; it is not measured.

layer_activations.py applies these rules to one decoder layer, part by part; this module holds
the shared rules (dtypes, the attention path, widths) and what is saved outside the layers.

Coefficients were then checked against the live-tensor counter on CPU (bench/memory_accuracy.py);
see bench/results/memory_accuracy.md for the errors reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory.framework_effects import returned_logits_bytes
from trainfit.core.memory import model_dropout
from trainfit.core.memory.states import base_weight_bytes
from trainfit.core.memory.stats import ModelStats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class Widths:
    """A decoder layer's widths, in elements per token."""

    hidden: int
    query: int  # heads x head_dim
    key_value: int  # kv heads x head_dim
    ffn: int  # MLP inner width a token passes through (MoE: top-k x expert width)
    heads: int


def quantised_inputs_per_token(spec: ModelSpec, st: ModelStats, setup: TrainingSetup) -> float:
    """Bytes per token and layer that bitsandbytes' quantised linears keep of their inputs.

    LLM.int8 (bitsandbytes MatMul8bitLt, threshold 6.0 as transformers sets it) keeps its 16-bit
    input A on ctx.tensors for every quantised linear whose input needs a gradient, where 4-bit
    layers keep only the weight since bitsandbytes 0.43.2 (before, they kept it too:
    core/runtime.py): the attention and MLP inputs (each shared by its readers), the
    attention output's contiguous copy read by o_proj and the gated product read by down_proj
    (bitsandbytes/autograd/_functions.py, read 2026-11-23). The outlier columns (subA, tokens x
    outliers) are a few columns and left out."""
    if not runtime_of(setup).quantised_inputs_kept:
        return 0.0
    shape = widths(spec, st)
    compute_bytes = dtype_bytes(spec, setup)[1]
    return compute_bytes * (shape.hidden * (1 if one_shared_norm(spec) else 2) + shape.query + shape.ffn)


def previous_step_bytes(spec: ModelSpec, st: ModelStats, setup: TrainingSetup, compute_bytes: int,
                        tokens: int) -> float:
    """What the previous micro-step leaves alive through the next forward (previous_step_kept,
    framework_effects.py): its returned logits, and the inputs bitsandbytes kept on its autograd ctx
    in every layer."""
    if not runtime_of(setup).previous_step_kept or setup.method == "dpo":
        return 0.0
    kept_inputs = (quantised_inputs_per_token(spec, st, setup) * spec.num_layers
                   if runtime_of(setup).previous_has_inputs else 0.0)
    return (returned_logits_bytes(spec, setup, compute_bytes) + kept_inputs) * tokens


def norms_per_block(spec: ModelSpec) -> int:
    return spec.block_norms or spec.capabilities.norms_per_block


def one_shared_norm(spec: ModelSpec) -> bool:
    """One LayerNorm feeding attention and MLP together (phi, falcon-7b's parallel_attn): its
    output is saved once for all of its readers."""
    return spec.capabilities.parallel_block or (spec.parallel_attention and norms_per_block(spec) == 1)


def widths(spec: ModelSpec, st: ModelStats) -> Widths:
    return Widths(spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                  st.ffn_width, spec.num_heads)


def dtype_bytes(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, int, bool]:
    """(residual-stream bytes, compute bytes, autocast?) for a precision mode."""
    precision = setup.precision
    mixed = precision.endswith("-mixed")
    residual = 4 if (precision == "fp32" or mixed) else 2
    compute = 4 if precision == "fp32" else 2
    if setup.method == "qlora" and not mixed and precision != "fp32":
        residual = 2
    # An fp32 residual stream over 16-bit weights (runtime.Runtime): PEFT's k-bit preparation made
    # the embeddings and norms fp32, or autocast's fp32 LayerNorm output runs through 4-bit linears,
    # which then flows as an fp32 model's does under autocast.
    runtime = runtime_of(setup)
    if runtime.fp32_stream_over_16bit_weights(spec):
        residual = 4
    return residual, compute, mixed or runtime.fp32_stream_under_autocast(spec)


def attention_kind(spec: ModelSpec, setup: TrainingSetup) -> str:
    """The attention path that runs: T5 adds a trainable relative position bias to the scores as
    a float mask, and an SDPA mask that needs a gradient sends SDPA down its math path, which
    materialises and saves the scores like eager attention does. With a frozen base (LoRA) the
    bias needs no gradient and SDPA keeps its fused kernel.
    Falcon's multi-query attention (one key/value head, the original architecture) before
    transformers 5.25 (Runtime.mqa_kv_unrepeated) hands SDPA keys with fewer heads than the
    queries; only the math path broadcasts them (measured on CPU: the same live peak as eager to the
    byte). 5.25's shared SDPA integration, like LitGPT, repeats them to every query head first, so
    SDPA keeps the fused kernel."""
    bias_trains = setup.method in ("full", "pretrain") or (setup.method == "dpo" and setup.lora is None)
    if spec.relative_attention_buckets and bias_trains:
        return "eager"
    if (spec.capabilities.sdpa_mqa_math_fallback and spec.num_kv_heads == 1 < spec.num_heads
            and setup.attention != "flash"
            and setup.model_code != "litgpt" and runtime_of(setup).mqa_kv_unrepeated):
        return "eager"
    return setup.attention


def attention_kv_len(spec: ModelSpec, seq_len: int) -> int:
    """Keys each query attends to in a materialised score matrix (eager): the full sequence;
    HF builds the full s x s scores even for sliding-window layers and masks them."""
    return seq_len


def routed_width(spec: ModelSpec) -> int:
    """The MoE inner width a token passes through in its routed experts (top-k x expert width)."""
    return spec.experts_per_token * (spec.moe_intermediate_size or spec.intermediate_size)


def step_tokens(setup: TrainingSetup) -> int:
    """Tokens a micro-step runs through each layer (DPO: chosen and rejected)."""
    return setup.micro_batch * (2 if setup.method == "dpo" else 1) * setup.seq_len


def expert_weight_bytes(setup: TrainingSetup) -> int:
    """Bytes per element of fused MoE experts' tensors. transformers >= 5 runs a layer's routed experts
    as one grouped matmul over 3-D parameters (integrations/moe.py), casting the tokens to the weights'
    dtype: autocast does not cast grouped_mm, so under mixed precision the experts run in the fp32
    master weights' dtype (measured on CPU: every saved expert tensor fp32 under bf16 autocast)."""
    return base_weight_bytes(setup)


def fused_experts_bytes_per_token(spec: ModelSpec, setup: TrainingSetup, *, experts_train: bool) -> float:
    """Saved per token and layer by the fused experts' grouped matmuls (saved-tensor graph on CPU): the
    gate/up output (kept whole by its two halves), the activation's output, the weighted expert output
    per routed copy; when the expert weights take a gradient (full training, or LoRA on the experts)
    also the gathered tokens and the product the down projection reads; and the router's probabilities."""
    element_bytes = expert_weight_bytes(setup)
    routed, top_k, hidden = routed_width(spec), spec.experts_per_token, spec.hidden_size
    return ((4 if experts_train else 3) * element_bytes * routed
            + (2 if experts_train else 1) * top_k * element_bytes * hidden + 4 * spec.num_experts)


def adapted_expert_weight_bytes(spec: ModelSpec, setup: TrainingSetup) -> float:
    """Per layer, with LoRA on fused experts: PEFT's ParamWrapper adds B @ A to the 3-D weights at
    every forward, and the grouped matmul keeps that full-size sum for its backward (gate/up and
    down of every expert; measured on CPU, Mixtral all-linear: the missing 2 MiB per layer)."""
    fe = spec.moe_intermediate_size or spec.intermediate_size
    return spec.num_experts * 3 * fe * spec.hidden_size * expert_weight_bytes(setup)


def frozen_weight_casts_per_layer(spec: ModelSpec, st: ModelStats, setup: TrainingSetup) -> float:
    """Per layer, autocast's 16-bit copies of a frozen fp32 base's weights. Autocast caches the cast of
    a weight only when it requires a gradient, so each frozen linear casts its weight afresh and the
    matmul keeps that copy for its input's gradient until the layer's backward (saved-tensor graph on
    CPU: Llama LoRA all-linear under bf16 autocast, 2 B per frozen linear weight). Fused experts are
    not cast (expert_weight_bytes); FSDP and DeepSpeed hand the layers 16-bit weights (no autocast)."""
    if not frozen_fp32_under_autocast(setup):
        return 0.0
    frozen = st.linear - (st.experts if runtime_of(setup).experts_fused else 0)
    return 2.0 * frozen / spec.num_layers


def frozen_fp32_under_autocast(setup: TrainingSetup) -> bool:
    """A frozen fp32 base run under autocast, whose weights autocast casts per use without caching."""
    fp32_base = setup.quant == "none" and setup.precision in ("bf16-mixed", "fp16-mixed")
    return fp32_base and engine_runs_autocast(setup)


def engine_runs_autocast(setup: TrainingSetup) -> bool:
    """Whether the layers run under autocast with the model's own weights. FSDP's mixed precision
    gathers 16-bit parameters and DeepSpeed's bf16/fp16 modes cast the module itself and run no
    autocast (Accelerate leaves native_amp off for DeepSpeed: accelerate/accelerator.py, v1.15.0)."""
    return setup.zero_stage == 0 and setup.fsdp_strategy == "none"


def mlp_norm_readers(spec: ModelSpec, st: ModelStats, setup: TrainingSetup) -> int:
    """Modules reading the MLP norm's output. With fused experts only the router (and a shared expert's
    gate, up and gating linears) read it as nn.Linear; the experts read a gathered copy."""
    if spec.num_experts and runtime_of(setup).experts_fused:
        return 1 + (3 if spec.shared_experts else 0)
    return st.mlp_inputs


def eager_scores_bytes(spec: ModelSpec, setup: TrainingSetup, tokens: int, seq_len: int) -> float:
    """Per layer, eager attention's saved probabilities: fp32 softmax + its 16-bit copy, and what the
    model's attention dropout keeps (model_dropout.py), which on CPU sends SDPA to its math path."""
    kind = attention_kind(spec, setup)
    scores = tokens * spec.num_heads * attention_kv_len(spec, seq_len)
    dropped = scores * model_dropout.attentions_per_block(spec)  # T5 drops its cross-attention's too
    if model_dropout.sdpa_math_fallback(spec, setup, kind):
        return dropped * model_dropout.MATH_SCORES_BYTES
    if kind != "eager":
        return 0.0
    _, compute_bytes, autocast = dtype_bytes(spec, setup)
    return (scores * (4 if compute_bytes == 4 else 6)
            + dropped * model_dropout.eager_scores_extra_bytes(spec, setup, compute_bytes, autocast))


def final_norm_bytes_per_token(spec: ModelSpec, setup: TrainingSetup, full: bool) -> float:
    """Saved per token outside the decoder layers: the final norm, the lm_head input, the model's own
    embedding dropout and the embedding / head parts of some architectures."""
    residual_bytes, compute_bytes, autocast = dtype_bytes(spec, setup)
    hidden = spec.hidden_size
    if spec.norm == "layernorm":
        saved = residual_bytes * hidden + 8
    else:
        saved = 4 * hidden + 4 + (residual_bytes * hidden if full else 0)
    saved += model_dropout.embedding_bytes_per_token(spec, setup, residual_bytes)
    if full:
        saved += 2 * hidden if autocast else residual_bytes * hidden  # lm_head input
    elif runtime_of(setup).quantised_inputs_kept and runtime_of(setup).quantised_lm_head_params(spec):
        # a quantised lm_head's matmul keeps its input like the layers' (runtime.Runtime)
        saved += compute_bytes * hidden
    if not full and frozen_fp32_under_autocast(setup):
        # the frozen fp32 lm_head's 16-bit copy, kept for its input's gradient (frozen_weight_casts_per_layer)
        saved += 2.0 * spec.vocab_size * hidden / step_tokens(setup)
    caps = spec.capabilities
    if caps.alibi_sdpa_mask and spec.position == "alibi" and attention_kind(spec, setup) != "eager":
        # The ALiBi bias goes to SDPA as one fp32 (batch, heads, s, s) mask shared by all layers.
        saved += 4 * spec.num_heads * setup.seq_len
    if caps.embedding_layernorm:
        saved += residual_bytes * hidden + 8  # word_embeddings_layernorm
    elif caps.encoder:
        # Embedding LayerNorm, then the MLM head: transform dense input, GELU input, LayerNorm
        # (post-LN encoders have no final norm; the head's LayerNorm takes its place above).
        saved += (residual_bytes * hidden + 8) + (residual_bytes * hidden if full else 0) + 2 * compute_bytes * hidden
    elif spec.decoder_layers:
        saved += 4 * hidden + 4  # the encoder's final_layer_norm
        # Relative position bias: one fp32 heads x s x s tensor per stack (encoder, decoder),
        # computed in the first block and added to every block's scores: per token 2 x 4 x heads x s.
        saved += 2 * 4 * spec.num_heads * setup.seq_len
    return saved


def loss_bytes_per_token(spec: ModelSpec, setup: TrainingSetup) -> tuple[float, float, float]:
    """(saved, forward transient, backward transient) bytes per token of logits + loss.

    transformers' ForCausalLMLoss upcasts logits to fp32 and calls cross_entropy: log_softmax's
    fp32 output is saved; its backward briefly holds grad(log_softmax) and grad(logits) (fp32).
    Gemma-2's final soft-capping (tanh) saves one more logits-sized tensor. Before transformers 4.49
    (TrainingSetup.logits_shift_copy) the shifted logits are copied before cross_entropy, and some
    architectures ran it on 16-bit logits (Runtime.legacy_loss_in_16bit).
    """
    _, compute_bytes, _ = dtype_bytes(spec, setup)
    vocab = spec.vocab_size
    runtime = runtime_of(setup)
    if runtime.legacy_loss_in_16bit(spec):
        # logits, their shifted copy and log_softmax's output, all 16-bit; backward: two grads
        return compute_bytes * vocab, 2 * compute_bytes * vocab, 2 * compute_bytes * vocab
    saved = 4 * vocab
    if spec.capabilities.logit_softcap:
        saved += compute_bytes * vocab
    forward = compute_bytes * vocab + (4 * vocab if compute_bytes != 4 else 0)
    if runtime.logits_upcast_by_forward(spec) and compute_bytes != 4:  # the forward upcast them
        forward = 4 * vocab
    if runtime.logits_shift_copy:  # `logits[..., :-1, :].contiguous()` of the fp32 logits
        # (of the 16-bit ones where the model's own forward shifts before autocast's fp32 cast)
        forward += (compute_bytes if runtime.legacy_loss_under_autocast(spec) else 4) * vocab
    backward = 8 * vocab
    return saved, forward, backward
