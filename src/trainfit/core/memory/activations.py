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

Coefficients were then checked against the live-tensor counter on CPU (bench/memory_accuracy.py);
see bench/results/memory_accuracy.md for the errors reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory.framework_effects import (
    fp32_stream_over_16bit_weights,
    fp32_stream_under_autocast,
    keeps_quantised_inputs,
    legacy_loss_in_16bit,
    legacy_loss_under_autocast,
    own_forward_loss,
    previous_has_inputs,
    quantised_lm_head,
    returned_logits_bytes,
)
from trainfit.core.memory import model_dropout
from trainfit.core.memory.states import base_weight_bytes, trained_param_bytes
from trainfit.core.memory.stats import ModelStats
from trainfit.core.model_spec import ModelSpec
from trainfit.core.params import QK_NORM_ARCHITECTURES
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class Widths:
    h: int
    q: int  # heads x head_dim
    kv: int  # kv heads x head_dim
    f: int  # MLP inner width a token passes through (MoE: top-k x expert width)
    heads: int


def quantised_inputs_per_token(spec: ModelSpec, st: ModelStats, setup: TrainingSetup) -> float:
    """Bytes per token and layer that bitsandbytes' quantised linears keep of their inputs.

    LLM.int8 (bitsandbytes MatMul8bitLt, threshold 6.0 as transformers sets it) keeps its 16-bit
    input A on ctx.tensors for every quantised linear whose input needs a gradient, where 4-bit
    layers keep only the weight since bitsandbytes 0.43.2 (before, they kept it too:
    framework_effects.py): the attention and MLP inputs (each shared by its readers), the
    attention output's contiguous copy read by o_proj and the gated product read by down_proj
    (bitsandbytes/autograd/_functions.py, read 2026-11-23). The outlier columns (subA, tokens x
    outliers) are a few columns and left out."""
    if not keeps_quantised_inputs(setup):
        return 0.0
    w = widths(spec, st)
    a = dtype_bytes(spec, setup)[1]
    return a * (w.h * (1 if one_shared_norm(spec) else 2) + w.q + w.f)


def previous_step_bytes(spec: ModelSpec, st: ModelStats, setup: TrainingSetup, compute_bytes: int,
                        tokens: int) -> float:
    """What the previous micro-step leaves alive through the next forward (previous_step_kept,
    framework_effects.py): its returned logits, and the inputs bitsandbytes kept on its autograd ctx
    in every layer."""
    if not setup.previous_step_kept or setup.method == "dpo":
        return 0.0
    kept_inputs = quantised_inputs_per_token(spec, st, setup) * spec.num_layers if previous_has_inputs(setup) else 0.0
    return (returned_logits_bytes(spec, setup, compute_bytes) + kept_inputs) * tokens


# RMSNorm as y * (1 + weight) computed in fp32 (Gemma's)
GEMMA_NORM = ("gemma", "gemma2", "gemma3_text")


def norms_per_block(spec: ModelSpec) -> int:
    return spec.block_norms or {"gemma2": 4, "gemma3_text": 4, "phi": 1}.get(spec.architecture, 2)


def one_shared_norm(spec: ModelSpec) -> bool:
    """One LayerNorm feeding attention and MLP together (phi, falcon-7b's parallel_attn): its
    output is saved once for all of its readers."""
    return spec.architecture == "phi" or (spec.parallel_attention and norms_per_block(spec) == 1)


def widths(spec: ModelSpec, st: ModelStats) -> Widths:
    return Widths(spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                  st.ffn_width, spec.num_heads)


def dtype_bytes(spec: ModelSpec, setup: TrainingSetup) -> tuple[int, int, bool]:
    """(residual-stream bytes, compute bytes, autocast?) for a precision mode."""
    p = setup.precision
    mixed = p.endswith("-mixed")
    residual = 4 if (p == "fp32" or mixed) else 2
    compute = 4 if p == "fp32" else 2
    if setup.method == "qlora" and not mixed and p != "fp32":
        residual = 2
    # An fp32 residual stream over 16-bit weights (framework_effects.py): PEFT's k-bit preparation made
    # the embeddings and norms fp32, or autocast's fp32 LayerNorm output runs through 4-bit linears,
    # which then flows as an fp32 model's does under autocast.
    if fp32_stream_over_16bit_weights(spec, setup):
        residual = 4
    return residual, compute, mixed or fp32_stream_under_autocast(spec, setup)


def attention_kind(spec: ModelSpec, setup: TrainingSetup) -> str:
    """The attention path that runs: T5 adds a trainable relative position bias to the scores as
    a float mask, and an SDPA mask that needs a gradient sends SDPA down its math path, which
    materialises and saves the scores like eager attention does. With a frozen base (LoRA) the
    bias needs no gradient and SDPA keeps its fused kernel.
    Falcon's multi-query attention (one key/value head, the original architecture) before
    transformers 5.25 (TrainingSetup.mqa_kv_unrepeated) hands SDPA keys with fewer heads than the
    queries; only the math path broadcasts them (measured on CPU: the same live peak as eager to the
    byte). 5.25's shared SDPA integration, like LitGPT, repeats them to every query head first, so
    SDPA keeps the fused kernel."""
    bias_trains = setup.method in ("full", "pretrain") or (setup.method == "dpo" and setup.lora is None)
    if spec.relative_attention_buckets and bias_trains:
        return "eager"
    if (spec.architecture == "falcon" and spec.num_kv_heads == 1 < spec.num_heads and setup.attention != "flash"
            and setup.model_code != "litgpt" and setup.mqa_kv_unrepeated):
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
    eb = expert_weight_bytes(setup)
    f, k, h = routed_width(spec), spec.experts_per_token, spec.hidden_size
    return (4 if experts_train else 3) * eb * f + (2 if experts_train else 1) * k * eb * h + 4 * spec.num_experts


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
    frozen = st.linear - (st.experts if setup.experts_fused else 0)
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
    if spec.num_experts and setup.experts_fused:
        return 1 + (3 if spec.shared_experts else 0)
    return st.mlp_inputs


def layer_bytes_per_token(spec: ModelSpec, st: ModelStats, setup: TrainingSetup,
                          lora_where: dict[str, int] | None) -> tuple[float, float]:
    """(saved bytes per token for one decoder layer, of which the attention core).

    `lora_where` is None for full training, else the adapted modules per block by position.
    """
    w = widths(spec, st)
    r, a, mixed = dtype_bytes(spec, setup)
    full = lora_where is None
    arch = spec.architecture
    rank = setup.lora.rank if setup.lora else 0
    dropout = bool(setup.lora and setup.lora.dropout > 0)
    litgpt = setup.model_code == "litgpt"
    # fp32 adapters (PEFT's autocast_adapter_dtype) on a 16-bit base without autocast cast their input
    # to fp32 and keep that copy; LitGPT's bf16-true adapters are bf16 like the rest (states.py).
    adapter_cast = 4 if (not full and a == 2 and not mixed and trained_param_bytes(setup) == 4) else 0
    # Dropout mask: the fused native_dropout (CUDA / ROCm / XPU) keeps a bool mask; CPU and MPS
    # multiply by a noise tensor of the input dtype and keep that (the model's own dropout's rule).
    mask = model_dropout.mask_bytes(setup, r)

    def norm() -> float:
        if spec.norm == "layernorm":
            return r * w.h + 8
        saved = 4 * w.h + 4  # fp32 input (a copy when the stream is 16-bit) and rsqrt
        if arch in ("gemma", "gemma2") and not litgpt:
            saved += 4 * w.h  # y * (1 + weight) in fp32 keeps y whatever trains (LitGPT's norm does not)
        elif arch == "gemma3_text" and full:
            saved += 4 * w.h  # Gemma 3's keeps the fp32 y only for its weight's gradient (measured on CPU)
        elif full:
            saved += r * w.h
        return saved

    def inputs(consumers: int, adapted: int, sites: int | None = None) -> float:
        """Saved copies of a norm output read by `consumers` linears, `adapted` of them LoRA,
        through `sites` dropouts (one per adapted module unless they share one)."""
        if full:
            return consumers * 2 * w.h if mixed else r * w.h
        if adapted == 0:
            return 0.0
        out = adapted * rank * (2 if mixed or litgpt else 4)  # A output, kept for dB
        if dropout:
            per = mask * w.h + (2 * w.h if mixed else r * w.h + adapter_cast * w.h)
            return out + (adapted if sites is None else sites) * per
        if mixed:
            return out + adapted * 2 * w.h
        if adapter_cast:
            return out + adapted * adapter_cast * w.h
        return out + r * w.h

    def inner(width: int, adapted: int) -> float:
        """Extra saved for LoRA on a module whose input is already saved (o_proj, down_proj)."""
        if adapted == 0:
            return 0.0
        out = adapted * rank * (2 if mixed or litgpt else 4)
        if dropout:
            m = 1 if setup.device != "cpu" else a
            return out + adapted * (m * width + a * width + (adapter_cast * width))
        return out + adapted * adapter_cast * width

    lw = lora_where or {}
    per_layer = 0.0  # kept per layer whatever the tokens (weight copies), added per token at the end
    n_norms = norms_per_block(spec)
    total = n_norms * norm()
    if spec.parallel_attention and n_norms == 2 and spec.norm == "layernorm":
        total -= r * w.h  # two LayerNorms of one parallel block read the same input: kept once
    shared = one_shared_norm(spec)
    attn_in = st.attn_inputs + (st.mlp_inputs if shared else 0)
    qkv = lw.get("attn_in", 0)
    # LitGPT adapts q, k and v in one LoRAQKVLinear: one dropout of the shared input, one A.
    qkv_sites = min(qkv, 1) if litgpt else qkv
    mlp_in = lw.get("mlp_in", 0) if shared else 0
    total += inputs(attn_in, qkv + mlp_in, qkv_sites + mlp_in)
    others = lw.get("attn_out", 0) + lw.get("mlp_in", 0) + lw.get("mlp_out", 0)
    if litgpt and qkv and (qkv < 3 if st.attn_inputs == 3 else not others):
        # Unless q, k and v are all adapted, LitGPT's zero_pad scatters the adapters' output into
        # a new tensor as wide as the adapted parts, and keeps it: q and v for two adapters. A
        # fused q/k/v module (falcon, gpt-neox, phi-3) adapted alone stands for LitGPT's default,
        # lora_query and lora_value without lora_key; with the projection or MLP adapted too, for
        # all three, as LitGPT's config hub sets them together.
        total += a * (w.q + w.kv)
    if not shared:
        total += inputs(mlp_norm_readers(spec, st, setup), lw.get("mlp_in", 0))

    # Attention core.
    rep = w.q if w.kv != w.q else w.kv
    if attention_kind(spec, setup) == "eager":
        core = a * (2 * w.q + 2 * rep)
    else:
        # Falcon's new decoder architecture broadcasts each key/value group to its query heads
        # (broadcast_to + reshape: copies) before SDPA, which saves them at full width.
        # LitGPT repeat_interleaves them to every query head the same way.
        kv_saved = w.q if arch == "falcon" or litgpt else w.kv
        core = a * (2 * w.q + 2 * kv_saved) + 4 * w.heads
        if (w.kv == w.q and (litgpt or arch == "gpt_neox")) or arch == "phi3":
            # LitGPT, GPT-NeoX and Phi-3 split one q+k+v output; without key groups to repeat (or with
            # SDPA's own grouped-query path, which transformers uses for Phi-3), the saved v is a view
            # of it and keeps all of it (q and k are rotated into new tensors).
            core += a * (w.q + w.kv)
        if arch == "phi3" and (full or (lw.get("attn_out", 0) and not dropout and not adapter_cast and not mixed)):
            # and its o_proj reads a contiguous copy of the attention output, where Llama's reads a
            # view of the output the attention saves (saved-tensor graph of one layer on CPU, fp32
            # and bf16; the meta trace at flash-attention's layout): kept when o_proj's weight trains
            # or its adapter reads it as it is (no dropout, no fp32 cast)
            core += a * w.q
        if model_dropout.sdpa_math_fallback(spec, setup, attention_kind(spec, setup)):
            core += model_dropout.math_core_extra_bytes(w.q, w.kv, w.heads, a)
    total += core + inner(w.q, lw.get("attn_out", 0))
    if mixed and not dropout and lw.get("attn_out", 0) and not litgpt:
        # PEFT casts an adapter's input to its fp32 weights' dtype and autocast casts it back for the
        # matmul, which keeps that 16-bit copy: the attention output is otherwise saved only as the
        # attention's own output (measured on CPU, Llama LoRA all-linear under bf16 autocast)
        total += 2 * w.q * lw.get("attn_out", 0)
    if arch in QK_NORM_ARCHITECTURES:
        # Per-head RMSNorm of the queries and keys before the rotary embedding (Qwen3): each keeps
        # its fp32 input (a copy of a 16-bit projection output), its rsqrt per head and, when its
        # weight trains, the normalised output it multiplies (measured on CPU: Qwen3 -16.8 % -> exact).
        # Gemma 3's y * (1 + weight) keeps the fp32 y when the weight trains.
        kept = (4 if arch in GEMMA_NORM else a) if full else 0
        total += (4 + kept) * (w.q + w.kv) + 4 * (w.heads + spec.num_kv_heads)
    if litgpt and lw.get("attn_out", 0) and not dropout:
        # LitGPT's y.transpose(1, 2).reshape(...) copies the attention output; the adapter keeps it.
        total += a * w.q
    if arch == "falcon" and spec.position == "alibi" and mixed and attention_kind(spec, setup) != "eager":
        # ALiBi falcon under autocast: each layer keeps a 16-bit copy of the (batch, heads, s, s)
        # ALiBi mask for SDPA and two more residual-width tensors (measured on CPU, forward-saved
        # bytes of 4 vs 2 layers at s = 256 and 512: a x heads x s + 2 r h per token, exact).
        total += a * w.heads * setup.seq_len + 2 * r * w.h

    if spec.decoder_layers:
        # T5 / mT5 decoder blocks also keep a cross-attention: its RMSNorm, the query input and
        # the attention core (keys and values come from the encoder output, saved once);
        # spread over all num_layers blocks, since the estimate multiplies by num_layers.
        cross = norm() + inputs(1, lw.get("attn_in", 0)) + core + inner(w.q, lw.get("attn_out", 0))
        total += cross * spec.decoder_layers / spec.num_layers

    # MLP. LitGPT computes GELU-tanh with one F.gelu(approximate="tanh"), which keeps only its input.
    gelu_new = spec.activation == "gelu_new" and not litgpt
    # The down projection's input is kept when its weight trains, or for an adapter that reads it
    # itself; without autocast an adapter's dropout keeps its own output instead (inner() below).
    # Under autocast it is kept either way (measured on CPU, PEFT all-linear with dropout). An fp32
    # adapter on a 16-bit base reads its own fp32 copy (adapter_cast, counted by inner()) instead.
    down_in = full or (lw.get("mlp_out", 0) and (not dropout or mixed) and not adapter_cast)
    fused_moe = bool(spec.num_experts) and setup.experts_fused
    f = w.f - routed_width(spec) if fused_moe else w.f  # what runs through nn.Linear modules
    if spec.gated_mlp and gelu_new:
        # mT5 / T5 v1.1 gated-gelu: NewGELUActivation is composed of tensor ops that keep its
        # input, tanh output, 0.5*x and 1+tanh; then gelu(gate), up and their product.
        mlp = (7 if down_in else 6) * a * f
    elif spec.gated_mlp:
        mlp = (4 if down_in else 3) * a * f
    elif gelu_new:
        mlp = (5 if down_in else 4) * a * f
    elif spec.activation == "relu":
        mlp = a * f  # relu's backward reads its output, which is also the down projection's input
    else:
        mlp = (2 if down_in else 1) * a * f
    if fused_moe:
        mlp += fused_experts_bytes_per_token(spec, setup, experts_train=full or bool(lw.get("experts", 0)))
        if spec.shared_experts:
            mlp += a * w.h  # the shared expert's output, kept by the product with its sigmoid gate
        if lw.get("experts", 0) and not full:
            per_layer += adapted_expert_weight_bytes(spec, setup)
    elif spec.num_experts:
        # Routed tokens are gathered per expert (a copy of h) and the expert output is weighted.
        mlp += spec.experts_per_token * 2 * a * w.h + 4 * spec.num_experts
    total += mlp + inner(f, lw.get("mlp_out", 0))
    total += model_dropout.block_bytes_per_token(spec, setup, w.f, a, bool(down_in))
    if not full:
        total += quantised_inputs_per_token(spec, st, setup)
        per_layer += frozen_weight_casts_per_layer(spec, st, setup)
    if setup.dora and not full:
        # DoRA keeps each adapted module's base and LoRA outputs, and with dropout the weight copy
        # F.linear multiplied (a per-layer amount): core/memory/dora.py.
        from trainfit.core.memory import dora

        total += dora.saved_bytes_per_token(spec, setup)
        per_layer += dora.saved_weight_bytes_per_layer(spec, setup)
    # Weight-sized tensors a layer keeps, spread over the layer's tokens like the rest.
    return total + per_layer / step_tokens(setup), core


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
    _, a, mixed = dtype_bytes(spec, setup)
    return scores * (4 if a == 4 else 6) + dropped * model_dropout.eager_scores_extra_bytes(spec, setup, a, mixed)


def final_norm_bytes_per_token(spec: ModelSpec, setup: TrainingSetup, full: bool) -> float:
    r, a, mixed = dtype_bytes(spec, setup)
    h = spec.hidden_size
    if spec.norm == "layernorm":
        saved = r * h + 8
    else:
        saved = 4 * h + 4 + (r * h if full else 0)
    saved += model_dropout.embedding_bytes_per_token(spec, setup, r)
    if full:
        saved += 2 * h if mixed else r * h  # lm_head input
    elif keeps_quantised_inputs(setup) and quantised_lm_head(spec, setup):
        saved += a * h  # a quantised lm_head's matmul keeps its input like the layers' (framework_effects.py)
    if not full and frozen_fp32_under_autocast(setup):
        # the frozen fp32 lm_head's 16-bit copy, kept for its input's gradient (frozen_weight_casts_per_layer)
        saved += 2.0 * spec.vocab_size * h / step_tokens(setup)
    arch = spec.architecture
    if arch == "falcon" and spec.position == "alibi" and attention_kind(spec, setup) != "eager":
        # The ALiBi bias goes to SDPA as one fp32 (batch, heads, s, s) mask shared by all layers.
        saved += 4 * spec.num_heads * setup.seq_len
    if arch == "bloom":
        saved += r * h + 8  # word_embeddings_layernorm
    elif arch in ("bert", "roberta"):
        # Embedding LayerNorm, then the MLM head: transform dense input, GELU input, LayerNorm
        # (post-LN encoders have no final norm; the head's LayerNorm takes its place above).
        saved += (r * h + 8) + (r * h if full else 0) + 2 * a * h
    elif spec.decoder_layers:
        saved += 4 * h + 4  # the encoder's final_layer_norm
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
    architectures ran it on 16-bit logits (framework_effects.legacy_loss_in_16bit).
    """
    _, a, _ = dtype_bytes(spec, setup)
    v = spec.vocab_size
    if legacy_loss_in_16bit(spec, setup):
        # logits, their shifted copy and log_softmax's output, all 16-bit; backward: two grads
        return a * v, 2 * a * v, 2 * a * v
    saved = 4 * v
    if spec.architecture == "gemma2":
        saved += a * v
    fwd = a * v + (4 * v if a != 4 else 0)
    if setup.logits_returned_fp32 and a != 4 and not own_forward_loss(spec):  # the forward upcast them
        fwd = 4 * v
    if setup.logits_shift_copy:  # `logits[..., :-1, :].contiguous()` of the fp32 logits
        # (of the 16-bit ones where the model's own forward shifts before autocast's fp32 cast)
        fwd += (a if legacy_loss_under_autocast(spec, setup) else 4) * v
    bwd = 8 * v
    return saved, fwd, bwd
