"""What one decoder layer saves for backward, per token, part by part.

activations.py explains the counting (what transformers' modeling code and PyTorch's autograd save,
tensor by tensor) and holds the shared rules (dtypes, the attention path that runs); this module
applies them to a layer: its norms and the inputs their readers keep, the attention core and what
surrounds it, T5's cross-attention, the MLP, and what adapters and quantised linears add. Each part
returns its terms in order and layer_bytes_per_token adds them up in that order.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.memory import dora, model_dropout
from trainfit.core.memory.activations import (adapted_expert_weight_bytes, attention_kind, dtype_bytes,
                                              frozen_weight_casts_per_layer, fused_experts_bytes_per_token,
                                              mlp_norm_readers, norms_per_block, one_shared_norm,
                                              quantised_inputs_per_token, routed_width, step_tokens, widths,
                                              Widths)
from trainfit.core.memory.states import trained_param_bytes
from trainfit.core.memory.stats import ModelStats
from trainfit.core.models.spec import ModelSpec
from trainfit.core.runtime import runtime_of
from trainfit.core.setup import TrainingSetup


@dataclass(frozen=True)
class Layer:
    """One decoder layer of a setup: its widths, dtypes and adapters."""

    spec: ModelSpec
    stats: ModelStats
    setup: TrainingSetup
    widths: Widths
    residual_bytes: int  # bytes per element of the residual stream
    compute_bytes: int  # bytes per element of matmul outputs
    autocast: bool  # mixed precision: every linear casts its fp32 input itself
    adapted: dict[str, int]  # adapted modules per block by position (empty for full training)
    full: bool  # every weight trains
    rank: int  # LoRA rank (0 without adapters)
    adapter_dropout: bool  # LoRA dropout > 0
    litgpt: bool  # LitGPT's model code
    # fp32 adapters (PEFT's autocast_adapter_dtype) on a 16-bit base without autocast cast their input
    # to fp32 and keep that copy; LitGPT's bf16-true adapters are bf16 like the rest (states.py).
    adapter_cast_bytes: int
    # Dropout mask: the fused native_dropout (CUDA / ROCm / XPU) keeps a bool mask; CPU and MPS
    # multiply by a noise tensor of the input dtype and keep that (the model's own dropout's rule).
    mask_bytes: int


def layer_of(spec: ModelSpec, st: ModelStats, setup: TrainingSetup, lora_where: dict[str, int] | None) -> Layer:
    """The decoder layer of `setup` on `spec`; `lora_where` None for full training, else the adapted
    modules per block by position."""
    residual_bytes, compute_bytes, autocast = dtype_bytes(spec, setup)
    full = lora_where is None
    adapter_cast = 4 if (not full and compute_bytes == 2 and not autocast and trained_param_bytes(setup) == 4) else 0
    return Layer(spec, st, setup, widths(spec, st), residual_bytes, compute_bytes, autocast, lora_where or {}, full,
                 setup.lora.rank if setup.lora else 0, bool(setup.lora and setup.lora.dropout > 0),
                 setup.model_code == "litgpt", adapter_cast, model_dropout.mask_bytes(setup, residual_bytes))


def layer_bytes_per_token(spec: ModelSpec, st: ModelStats, setup: TrainingSetup,
                          lora_where: dict[str, int] | None) -> tuple[float, float]:
    """(saved bytes per token for one decoder layer, of which the attention core).

    `lora_where` is None for full training, else the adapted modules per block by position.
    """
    layer = layer_of(spec, st, setup, lora_where)
    core = attention_core_bytes(layer)
    mlp, mlp_per_layer = mlp_terms(layer)
    adapters, adapter_per_layer = adapter_terms(layer)
    total = 0.0
    for term in (norm_terms(layer) + attention_terms(layer, core) + cross_attention_terms(layer, core) + mlp
                 + adapters):
        total += term
    per_layer = 0.0  # kept per layer whatever the tokens (weight copies), added per token at the end
    for term in mlp_per_layer + adapter_per_layer:
        per_layer += term
    # Weight-sized tensors a layer keeps, spread over the layer's tokens like the rest.
    return total + per_layer / step_tokens(setup), core


def norm_bytes(layer: Layer) -> float:
    """Saved by one of the block's norms."""
    hidden, residual_bytes = layer.widths.hidden, layer.residual_bytes
    if layer.spec.norm == "layernorm":
        return residual_bytes * hidden + 8
    saved = 4 * hidden + 4  # fp32 input (a copy when the stream is 16-bit) and rsqrt
    caps = layer.spec.capabilities
    if caps.norm_fp32_output == "always" and not layer.litgpt:
        saved += 4 * hidden  # y * (1 + weight) in fp32 keeps y whatever trains (LitGPT's norm does not)
    elif caps.norm_fp32_output == "when_weight_trains" and layer.full:
        saved += 4 * hidden  # Gemma 3's keeps the fp32 y only for its weight's gradient (measured on CPU)
    elif layer.full:
        saved += residual_bytes * hidden
    return saved


def norm_output_bytes(layer: Layer, consumers: int, adapted: int, sites: int | None = None) -> float:
    """Saved copies of a norm output read by `consumers` linears, `adapted` of them LoRA,
    through `sites` dropouts (one per adapted module unless they share one)."""
    hidden, residual_bytes = layer.widths.hidden, layer.residual_bytes
    if layer.full:
        return consumers * 2 * hidden if layer.autocast else residual_bytes * hidden
    if adapted == 0:
        return 0.0
    out = adapted * layer.rank * (2 if layer.autocast or layer.litgpt else 4)  # A output, kept for dB
    if layer.adapter_dropout:
        per = layer.mask_bytes * hidden + (2 * hidden if layer.autocast else
                                           residual_bytes * hidden + layer.adapter_cast_bytes * hidden)
        return out + (adapted if sites is None else sites) * per
    if layer.autocast:
        return out + adapted * 2 * hidden
    if layer.adapter_cast_bytes:
        return out + adapted * layer.adapter_cast_bytes * hidden
    return out + residual_bytes * hidden


def adapter_inner_bytes(layer: Layer, width: int, adapted: int) -> float:
    """Extra saved for LoRA on a module whose input is already saved (o_proj, down_proj)."""
    if adapted == 0:
        return 0.0
    out = adapted * layer.rank * (2 if layer.autocast or layer.litgpt else 4)
    if layer.adapter_dropout:
        mask = 1 if layer.setup.device != "cpu" else layer.compute_bytes
        return out + adapted * (mask * width + layer.compute_bytes * width + (layer.adapter_cast_bytes * width))
    return out + adapted * layer.adapter_cast_bytes * width


def norm_terms(layer: Layer) -> list[float]:
    """The block's norms and the inputs their readers (attention, MLP) keep."""
    spec, st, shape, adapted = layer.spec, layer.stats, layer.widths, layer.adapted
    n_norms = norms_per_block(spec)
    terms = [n_norms * norm_bytes(layer)]
    if spec.parallel_attention and n_norms == 2 and spec.norm == "layernorm":
        # two LayerNorms of one parallel block read the same input: kept once
        terms.append(-layer.residual_bytes * shape.hidden)
    shared = one_shared_norm(spec)
    attn_in = st.attn_inputs + (st.mlp_inputs if shared else 0)
    qkv = adapted.get("attn_in", 0)
    # LitGPT adapts q, k and v in one LoRAQKVLinear: one dropout of the shared input, one A.
    qkv_sites = min(qkv, 1) if layer.litgpt else qkv
    mlp_in = adapted.get("mlp_in", 0) if shared else 0
    terms.append(norm_output_bytes(layer, attn_in, qkv + mlp_in, qkv_sites + mlp_in))
    others = adapted.get("attn_out", 0) + adapted.get("mlp_in", 0) + adapted.get("mlp_out", 0)
    if layer.litgpt and qkv and (qkv < 3 if st.attn_inputs == 3 else not others):
        # Unless q, k and v are all adapted, LitGPT's zero_pad scatters the adapters' output into
        # a new tensor as wide as the adapted parts, and keeps it: q and v for two adapters. A
        # fused q/k/v module (falcon, gpt-neox, phi-3) adapted alone stands for LitGPT's default,
        # lora_query and lora_value without lora_key; with the projection or MLP adapted too, for
        # all three, as LitGPT's config hub sets them together.
        terms.append(layer.compute_bytes * (shape.query + shape.key_value))
    if not shared:
        terms.append(norm_output_bytes(layer, mlp_norm_readers(spec, st, layer.setup), adapted.get("mlp_in", 0)))
    return terms


def attention_core_bytes(layer: Layer) -> float:
    """Saved by the attention itself: q, k, v and the output, and the fused kernels' logsumexp
    (eager attention's scores are counted apart: activations.eager_scores_bytes)."""
    spec, setup, shape, compute_bytes = layer.spec, layer.setup, layer.widths, layer.compute_bytes
    caps = spec.capabilities
    repeated = shape.query if shape.key_value != shape.query else shape.key_value
    if attention_kind(spec, setup) == "eager":
        return compute_bytes * (2 * shape.query + 2 * repeated)
    # Falcon's new decoder architecture broadcasts each key/value group to its query heads
    # (broadcast_to + reshape: copies) before SDPA, which saves them at full width.
    # LitGPT repeat_interleaves them to every query head the same way.
    kv_saved = shape.query if caps.kv_broadcast_before_sdpa or layer.litgpt else shape.key_value
    core = compute_bytes * (2 * shape.query + 2 * kv_saved) + 4 * shape.heads
    if ((shape.key_value == shape.query and (layer.litgpt or caps.fused_qkv_v_view == "no_kv_groups"))
            or caps.fused_qkv_v_view == "always"):
        # LitGPT, GPT-NeoX and Phi-3 split one q+k+v output; without key groups to repeat (or with
        # SDPA's own grouped-query path, which transformers uses for Phi-3), the saved v is a view
        # of it and keeps all of it (q and k are rotated into new tensors).
        core += compute_bytes * (shape.query + shape.key_value)
    attn_out = layer.adapted.get("attn_out", 0)
    if caps.o_proj_copy and (layer.full or (attn_out and not layer.adapter_dropout and not layer.adapter_cast_bytes
                                          and not layer.autocast)):
        # and its o_proj reads a contiguous copy of the attention output, where Llama's reads a
        # view of the output the attention saves (saved-tensor graph of one layer on CPU, fp32
        # and bf16; the meta trace at flash-attention's layout): kept when o_proj's weight trains
        # or its adapter reads it as it is (no dropout, no fp32 cast)
        core += compute_bytes * shape.query
    if model_dropout.sdpa_math_fallback(spec, setup, attention_kind(spec, setup)):
        core += model_dropout.math_core_extra_bytes(shape.query, shape.key_value, shape.heads, compute_bytes)
    return core


def attention_terms(layer: Layer, core: float) -> list[float]:
    """The attention core with the output projection's adapter, and what surrounds the attention:
    casts of the adapter's input, per-head q/k norms, LitGPT's copy, falcon's ALiBi mask."""
    spec, setup, shape, compute_bytes = layer.spec, layer.setup, layer.widths, layer.compute_bytes
    caps = spec.capabilities
    attn_out = layer.adapted.get("attn_out", 0)
    terms = [core + adapter_inner_bytes(layer, shape.query, attn_out)]
    if layer.autocast and not layer.adapter_dropout and attn_out and not layer.litgpt:
        # PEFT casts an adapter's input to its fp32 weights' dtype and autocast casts it back for the
        # matmul, which keeps that 16-bit copy: the attention output is otherwise saved only as the
        # attention's own output (measured on CPU, Llama LoRA all-linear under bf16 autocast)
        terms.append(2 * shape.query * attn_out)
    if caps.qk_norm != "none":
        # Per-head RMSNorm of the queries and keys before the rotary embedding (Qwen3): each keeps
        # its fp32 input (a copy of a 16-bit projection output), its rsqrt per head and, when its
        # weight trains, the normalised output it multiplies (measured on CPU: Qwen3 -16.8 % -> exact).
        # Gemma 3's y * (1 + weight) keeps the fp32 y when the weight trains.
        kept = (4 if caps.norm_fp32_output != "none" else compute_bytes) if layer.full else 0
        terms.append((4 + kept) * (shape.query + shape.key_value) + 4 * (shape.heads + spec.num_kv_heads))
    if layer.litgpt and attn_out and not layer.adapter_dropout:
        # LitGPT's y.transpose(1, 2).reshape(...) copies the attention output; the adapter keeps it.
        terms.append(compute_bytes * shape.query)
    if caps.alibi_sdpa_mask and spec.position == "alibi" and layer.autocast and attention_kind(spec, setup) != "eager":
        # ALiBi falcon under autocast: each layer keeps a 16-bit copy of the (batch, heads, s, s)
        # ALiBi mask for SDPA and two more residual-width tensors (measured on CPU, forward-saved
        # bytes of 4 vs 2 layers at s = 256 and 512: a x heads x s + 2 r h per token, exact).
        terms.append(compute_bytes * shape.heads * setup.seq_len + 2 * layer.residual_bytes * shape.hidden)
    return terms


def cross_attention_terms(layer: Layer, core: float) -> list[float]:
    """T5 / mT5 decoder blocks also keep a cross-attention: its RMSNorm, the query input and
    the attention core (keys and values come from the encoder output, saved once);
    spread over all num_layers blocks, since the estimate multiplies by num_layers."""
    spec = layer.spec
    if not spec.decoder_layers:
        return []
    cross = (norm_bytes(layer) + norm_output_bytes(layer, 1, layer.adapted.get("attn_in", 0)) + core
             + adapter_inner_bytes(layer, layer.widths.query, layer.adapted.get("attn_out", 0)))
    return [cross * spec.decoder_layers / spec.num_layers]


def mlp_terms(layer: Layer) -> tuple[list[float], list[float]]:
    """(per-token terms, per-layer terms) of the MLP: its activation's saved tensors, the down
    projection's input, routed experts, and the model's own dropout in the block."""
    spec, setup, shape, compute_bytes = layer.spec, layer.setup, layer.widths, layer.compute_bytes
    adapted, full = layer.adapted, layer.full
    # LitGPT computes GELU-tanh with one F.gelu(approximate="tanh"), which keeps only its input.
    gelu_new = spec.activation == "gelu_new" and not layer.litgpt
    # The down projection's input is kept when its weight trains, or for an adapter that reads it
    # itself; without autocast an adapter's dropout keeps its own output instead (adapter_inner_bytes).
    # Under autocast it is kept either way (measured on CPU, PEFT all-linear with dropout). An fp32
    # adapter on a 16-bit base reads its own fp32 copy (adapter_cast_bytes, counted by
    # adapter_inner_bytes) instead.
    down_in = full or (adapted.get("mlp_out", 0) and (not layer.adapter_dropout or layer.autocast)
                       and not layer.adapter_cast_bytes)
    fused_moe = bool(spec.num_experts) and runtime_of(setup).experts_fused
    ffn = shape.ffn - routed_width(spec) if fused_moe else shape.ffn  # what runs through nn.Linear modules
    if spec.gated_mlp and gelu_new:
        # mT5 / T5 v1.1 gated-gelu: NewGELUActivation is composed of tensor ops that keep its
        # input, tanh output, 0.5*x and 1+tanh; then gelu(gate), up and their product.
        mlp = (7 if down_in else 6) * compute_bytes * ffn
    elif spec.gated_mlp:
        mlp = (4 if down_in else 3) * compute_bytes * ffn
    elif gelu_new:
        mlp = (5 if down_in else 4) * compute_bytes * ffn
    elif spec.activation == "relu":
        mlp = compute_bytes * ffn  # relu's backward reads its output, which is also the down projection's input
    else:
        mlp = (2 if down_in else 1) * compute_bytes * ffn
    per_layer = []
    if fused_moe:
        mlp += fused_experts_bytes_per_token(spec, setup, experts_train=full or bool(adapted.get("experts", 0)))
        if spec.shared_experts:
            mlp += compute_bytes * shape.hidden  # the shared expert's output, kept by the product with its sigmoid gate
        if adapted.get("experts", 0) and not full:
            per_layer.append(adapted_expert_weight_bytes(spec, setup))
    elif spec.num_experts:
        # Routed tokens are gathered per expert (a copy of h) and the expert output is weighted.
        mlp += spec.experts_per_token * 2 * compute_bytes * shape.hidden + 4 * spec.num_experts
    terms = [mlp + adapter_inner_bytes(layer, ffn, adapted.get("mlp_out", 0)),
             model_dropout.block_bytes_per_token(spec, setup, shape.ffn, compute_bytes, bool(down_in))]
    return terms, per_layer


def adapter_terms(layer: Layer) -> tuple[list[float], list[float]]:
    """(per-token terms, per-layer terms) that a frozen base adds: the inputs quantised linears keep,
    autocast's casts of frozen fp32 weights, and DoRA's saved outputs and weight copies."""
    if layer.full:
        return [], []
    spec, st, setup = layer.spec, layer.stats, layer.setup
    terms = [quantised_inputs_per_token(spec, st, setup)]
    per_layer = [frozen_weight_casts_per_layer(spec, st, setup)]
    if setup.dora:
        # DoRA keeps each adapted module's base and LoRA outputs, and with dropout the weight copy
        # F.linear multiplied (a per-layer amount): core/memory/dora.py.
        terms.append(dora.saved_bytes_per_token(spec, setup))
        per_layer.append(dora.saved_weight_bytes_per_layer(spec, setup))
    return terms, per_layer
