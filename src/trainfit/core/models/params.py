"""Exact parameter counts and the linear layers of a ModelSpec, as transformers builds them.

One layout function per architecture family describes a decoder block (its linear layers and
norm parameters) with the module names transformers uses; `count_params`, `linear_layers` and
`lora_params` all read that one layout, so counts and LoRA targets cannot disagree.

Checked exactly against `sum(p.numel() for p in model.parameters())` of the transformers model
built on the meta device for every catalog entry (tests/models/test_params_vs_transformers.py),
and LoRA counts against `peft.get_peft_model(...)` trainable parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trainfit.core.models.capabilities import SUPPORTED_ARCHITECTURES
from trainfit.core.models.spec import ModelSpec
from trainfit.errors import BadInputError

LayerKind = Literal["linear", "lm_head", "expert", "router"]

# Block layouts with one fused q/k/v projection and a plain (or, for Qwen v1, gated) MLP, written
# below from transformers' modeling_<arch>.py (Qwen v1: the published remote-code modeling_qwen.py).
FUSED_QKV_LAYOUTS = ("self_attention_query_key_value", "c_attn_c_fc", "c_attn_w1_w2")

# Qwen2-VL patch embedding is a Conv3d over (3 channels x 2 frames x patch x patch), no bias.
# Source: transformers/models/qwen2_vl/modeling_qwen2_vl.py (PatchEmbed), config temporal_patch_size=2.
QWEN2VL_IN_CHANNELS = 3
QWEN2VL_TEMPORAL_PATCH = 2


@dataclass(frozen=True)
class LinearLayer:
    """One kind of linear module, repeated `count` times over the model."""

    name: str  # module name as in transformers: "q_proj", "c_attn", "query_key_value", ...
    path: str  # path inside its block: "self_attn.q_proj", "mlp.c_proj", "merger.mlp.0", "lm_head"
    in_features: int
    out_features: int
    count: int  # instances over the whole model (layers; for experts: layers x experts)
    bias: bool
    vision: bool  # in the vision tower (VLMs)
    # "expert": a slice of a fused 3D expert parameter (transformers >= 5 stores MoE experts as
    # experts.gate_up_proj / experts.down_proj tensors); "router": the MoE router weight (a plain
    # parameter, not an nn.Linear, in transformers >= 5). PEFT reaches both via target_parameters,
    # and for Mixtral and Qwen3-MoE also via the transformers-4 module names (ModelCapabilities.peft_v4_names).
    kind: LayerKind = "linear"

    @property
    def params(self) -> int:
        return self.count * (self.in_features * self.out_features + (self.out_features if self.bias else 0))


@dataclass(frozen=True)
class ParamBreakdown:
    embedding: int  # token embeddings
    position_embedding: int  # learned absolute positions (GPT-2); 0 for RoPE / ALiBi
    lm_head: int  # 0 when tied to the token embeddings
    num_layers: int
    attention_per_layer: int  # projections (+ biases, + q/k norms where the block has them)
    mlp_per_layer: int  # dense MLP; for MoE the shared expert(s) and their gate
    norms_per_layer: int
    router_per_layer: int  # MoE router weights
    experts_per_layer: int  # all routed experts of one layer
    final_norm: int
    vision: int  # vision tower incl. patch embedding and merger/projector
    total: int
    # Parameters one text token passes through: all but the routed experts it is not sent to,
    # and without the vision tower (which runs per image, not per token). Includes embeddings.
    active_per_token: int
    # T5 decoder blocks' cross-attention (projections + its norm), all decoder layers together.
    cross_attention: int = 0
    # Parameters outside the blocks and the fields above: BLOOM's embedding LayerNorm, BERT's
    # token-type embeddings + embedding LayerNorm + MLM head (transform and output bias), T5's
    # relative position tables.
    other: int = 0

    @property
    def per_layer(self) -> int:
        return (self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer
                + self.router_per_layer + self.experts_per_layer)


@dataclass(frozen=True)
class _Block:
    attention: list[LinearLayer]  # per-layer count 1
    mlp: list[LinearLayer]
    experts: list[LinearLayer]  # count = experts per layer
    attention_extra: int  # non-linear attention params per layer (q_norm/k_norm)
    norms: int
    router: int
    # Linears outside the repeated block, with whole-model counts: T5's feed-forward (its path
    # differs between encoder and decoder blocks) and cross-attention, BERT's MLM head transform.
    extra: tuple[LinearLayer, ...] = ()


def _lin(name: str, path: str, n_in: int, n_out: int, bias: bool, count: int = 1,
         kind: LayerKind = "linear", vision: bool = False) -> LinearLayer:
    return LinearLayer(name, path, n_in, n_out, count, bias, vision, kind)


def _norm_params(spec: ModelSpec, width: int) -> int:
    # RMSNorm has a weight only; LayerNorm a weight and a bias.
    return width * (2 if spec.norm == "layernorm" else 1)


def _check_arch(spec: ModelSpec) -> None:
    if not spec.capabilities.supported:
        raise BadInputError(
            f"model {spec.id!r}: architecture {spec.architecture!r} is not supported",
            hint=f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}",
        )


def _per_spec(fn):
    """Remember fn(spec) for the spec object itself: the planner asks for the same shapes a
    thousand times, and a ModelSpec (frozen, but holding lists) cannot be a dict key. The cache
    keeps the spec alive, so its id is never reused while the entry stands."""
    results: dict[int, tuple[ModelSpec, Any]] = {}

    def cached(spec: ModelSpec):
        hit = results.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        if len(results) >= 4096:
            results.clear()
        value = fn(spec)
        results[id(spec)] = (spec, value)
        return value

    cached.__doc__, cached.__name__, cached.__wrapped__ = fn.__doc__, fn.__name__, fn  # type: ignore[attr-defined]
    return cached


@_per_spec
def _block(spec: ModelSpec) -> _Block:
    """The decoder block of `spec`, named as in transformers' modeling_<arch>.py."""
    _check_arch(spec)
    h, d = spec.hidden_size, spec.head_dim
    q_out, kv_out = spec.num_heads * d, spec.num_kv_heads * d
    caps = spec.capabilities
    ffn = spec.intermediate_size
    norm1 = _norm_params(spec, h)
    if caps.block_layout in FUSED_QKV_LAYOUTS:
        return _fused_qkv_block(spec)
    if caps.encoder_decoder:
        return _t5_block(spec)
    if caps.encoder:
        return _encoder_block(spec)
    if caps.block_layout == "llama_like":
        return _llama_like_block(spec)
    if caps.block_layout == "qkv_proj_gate_up_proj":  # fused qkv and gate/up projections
        attn = [
            _lin("qkv_proj", "self_attn.qkv_proj", h, q_out + 2 * kv_out, spec.qkv_bias),
            _lin("o_proj", "self_attn.o_proj", q_out, h, spec.o_bias),
        ]
        mlp = [
            _lin("gate_up_proj", "mlp.gate_up_proj", h, 2 * ffn, spec.mlp_bias),
            _lin("down_proj", "mlp.down_proj", ffn, h, spec.mlp_bias),
        ]
        return _Block(attn, mlp, [], 0, 2 * norm1, 0)
    if caps.block_layout == "parallel_dense_fc":  # parallel attention + MLP behind one LayerNorm
        attn = [
            _lin("q_proj", "self_attn.q_proj", h, q_out, spec.qkv_bias),
            _lin("k_proj", "self_attn.k_proj", h, kv_out, spec.qkv_bias),
            _lin("v_proj", "self_attn.v_proj", h, kv_out, spec.qkv_bias),
            _lin("dense", "self_attn.dense", q_out, h, spec.o_bias),
        ]
        mlp = [_lin("fc1", "mlp.fc1", h, ffn, spec.mlp_bias), _lin("fc2", "mlp.fc2", ffn, h, spec.mlp_bias)]
        return _Block(attn, mlp, [], 0, norm1, 0)
    if caps.block_layout == "conv1d_c_attn":  # Conv1D modules (PEFT treats them as linear, fan_in_fan_out)
        attn = [
            _lin("c_attn", "attn.c_attn", h, q_out + 2 * kv_out, spec.qkv_bias),
            _lin("c_proj", "attn.c_proj", q_out, h, spec.o_bias),
        ]
        mlp = [_lin("c_fc", "mlp.c_fc", h, ffn, spec.mlp_bias), _lin("c_proj", "mlp.c_proj", ffn, h, spec.mlp_bias)]
        return _Block(attn, mlp, [], 0, 2 * norm1, 0)
    # gpt_neox (Pythia): fused query_key_value; checkpoints call the lm_head "embed_out",
    # transformers >= 5 renames it to "lm_head" on load.
    attn = [
        _lin("query_key_value", "attention.query_key_value", h, q_out + 2 * kv_out, spec.qkv_bias),
        _lin("dense", "attention.dense", q_out, h, spec.o_bias),
    ]
    mlp = [
        _lin("dense_h_to_4h", "mlp.dense_h_to_4h", h, ffn, spec.mlp_bias),
        _lin("dense_4h_to_h", "mlp.dense_4h_to_h", ffn, h, spec.mlp_bias),
    ]
    return _Block(attn, mlp, [], 0, 2 * norm1, 0)


def _llama_like_block(spec: ModelSpec) -> _Block:
    """Llama's block (q/k/v/o, gated MLP) and the MoE ones (router, fused experts, a shared expert)."""
    h, d, ffn, caps = spec.hidden_size, spec.head_dim, spec.intermediate_size, spec.capabilities
    q_out, kv_out = spec.num_heads * d, spec.num_kv_heads * d
    norm1 = _norm_params(spec, h)
    attn = [
        _lin("q_proj", "self_attn.q_proj", h, q_out, spec.qkv_bias),
        _lin("k_proj", "self_attn.k_proj", h, kv_out, spec.qkv_bias),
        _lin("v_proj", "self_attn.v_proj", h, kv_out, spec.qkv_bias),
        _lin("o_proj", "self_attn.o_proj", q_out, h, spec.o_bias),
    ]
    # q_norm / k_norm: per head (Qwen3) or over the whole projection (OLMo 2).
    extra = (q_out + kv_out if caps.qk_norm == "whole_projection" else 2 * d) if caps.qk_norm != "none" else 0
    # Gemma-2 and Gemma 3 add pre/post feed-forward norms around the MLP: four per block.
    norms = norm1 * caps.norms_per_block
    mlp: list[LinearLayer] = []
    experts: list[LinearLayer] = []
    router = 0
    if caps.moe:
        e, ffn_e = spec.num_experts, spec.moe_intermediate_size or ffn
        router = e * h
        experts = [
            _lin("gate", "mlp.gate", h, e, False, 1, "router"),
            _lin("gate_up_proj", "mlp.experts.gate_up_proj", h, 2 * ffn_e, False, e, "expert"),
            _lin("down_proj", "mlp.experts.down_proj", ffn_e, h, False, e, "expert"),
        ]
        if spec.shared_experts:
            shared = spec.shared_experts * ffn_e
            mlp = [
                _lin("gate_proj", "mlp.shared_expert.gate_proj", h, shared, spec.mlp_bias),
                _lin("up_proj", "mlp.shared_expert.up_proj", h, shared, spec.mlp_bias),
                _lin("down_proj", "mlp.shared_expert.down_proj", shared, h, spec.mlp_bias),
                _lin("shared_expert_gate", "mlp.shared_expert_gate", h, 1, False),
            ]
    else:
        mlp = [
            _lin("gate_proj", "mlp.gate_proj", h, ffn, spec.mlp_bias),
            _lin("up_proj", "mlp.up_proj", h, ffn, spec.mlp_bias),
            _lin("down_proj", "mlp.down_proj", ffn, h, spec.mlp_bias),
        ]
    return _Block(attn, mlp, experts, extra, norms, router)


def _fused_qkv_block(spec: ModelSpec) -> _Block:
    """Falcon, GPTBigCode (SantaCoder/StarCoder), BLOOM and Qwen v1: one fused q/k/v projection.

    Sources: transformers models/falcon/modeling_falcon.py (FalconAttention, FalconMLP;
    num_ln_in_parallel_attn), models/gpt_bigcode/modeling_gpt_bigcode.py (c_attn is
    embed_dim + 2 x kv_dim, nn.Linear), models/bloom/modeling_bloom.py; Qwen v1:
    https://huggingface.co/Qwen/Qwen-7B/blob/main/modeling_qwen.py (QWenAttention c_attn with
    bias, c_proj without when no_bias; QWenMLP w1, w2 of intermediate_size/2, c_proj).
    """
    h, d, layout = spec.hidden_size, spec.head_dim, spec.capabilities.block_layout
    q_out, kv_out, ffn = spec.num_heads * d, spec.num_kv_heads * d, spec.intermediate_size
    qkv_b, o_b, m_b = spec.qkv_bias, spec.o_bias, spec.mlp_bias
    norm1 = _norm_params(spec, h)
    qkv = q_out + 2 * kv_out
    if layout in ("c_attn_c_fc", "c_attn_w1_w2"):
        attn = [_lin("c_attn", "attn.c_attn", h, qkv, qkv_b), _lin("c_proj", "attn.c_proj", q_out, h, o_b)]
        if layout == "c_attn_c_fc":
            mlp = [_lin("c_fc", "mlp.c_fc", h, ffn, m_b), _lin("c_proj", "mlp.c_proj", ffn, h, m_b)]
        else:  # Qwen v1: c_proj(w1(x) * silu(w2(x)))
            mlp = [_lin("w1", "mlp.w1", h, ffn, m_b), _lin("w2", "mlp.w2", h, ffn, m_b),
                   _lin("c_proj", "mlp.c_proj", ffn, h, m_b)]
        return _Block(attn, mlp, [], 0, 2 * norm1, 0)
    attn = [_lin("query_key_value", "self_attention.query_key_value", h, qkv, qkv_b),
            _lin("dense", "self_attention.dense", q_out, h, o_b)]
    mlp = [_lin("dense_h_to_4h", "mlp.dense_h_to_4h", h, ffn, m_b),
           _lin("dense_4h_to_h", "mlp.dense_4h_to_h", ffn, h, m_b)]
    return _Block(attn, mlp, [], 0, (spec.block_norms or 2) * norm1, 0)


def _t5_block(spec: ModelSpec) -> _Block:
    """T5 / mT5 (transformers models/t5/modeling_t5.py): every block has T5Attention q, k, v, o
    (no biases) at layer.0; decoder blocks add EncDecAttention at layer.1; the feed-forward is
    DenseReluDense wi, wo (wi_0, wi_1, wo when gated) at layer.1 (encoder) / layer.2 (decoder).
    T5LayerNorm is RMS-style (weight only)."""
    h, inner, ffn = spec.hidden_size, spec.num_heads * spec.head_dim, spec.intermediate_size
    dec = spec.decoder_layers
    enc = spec.num_layers - dec
    attn = [_lin(x, f"layer.0.SelfAttention.{x}", h if x != "o" else inner, inner if x != "o" else h, False)
            for x in ("q", "k", "v", "o")]
    cross = [_lin(x, f"decoder.layer.1.EncDecAttention.{x}", h if x != "o" else inner, inner if x != "o" else h,
                  False, dec) for x in ("q", "k", "v", "o")]
    ff_in = ["wi_0", "wi_1"] if spec.gated_mlp else ["wi"]
    ff: list[LinearLayer] = []
    for side, count, pos in (("encoder", enc, 1), ("decoder", dec, 2)):
        ff += [_lin(x, f"{side}.layer.{pos}.DenseReluDense.{x}", h, ffn, False, count) for x in ff_in]
        ff.append(_lin("wo", f"{side}.layer.{pos}.DenseReluDense.wo", ffn, h, False, count))
    return _Block(attn, [], [], 0, 2 * h, 0, tuple(cross + ff))


def _encoder_block(spec: ModelSpec) -> _Block:
    """BERT / RoBERTa (transformers models/bert/modeling_bert.py, models/roberta/...): post-LN
    blocks of attention.self.query/key/value, attention.output.dense + LayerNorm,
    intermediate.dense, output.dense + LayerNorm, all with biases; the MLM head's transform dense
    (cls.predictions.transform.dense / lm_head.dense) is a linear outside the blocks."""
    h, inner, ffn = spec.hidden_size, spec.num_heads * spec.head_dim, spec.intermediate_size
    attn = [_lin(x, f"attention.self.{x}", h, inner, True) for x in ("query", "key", "value")]
    attn.append(_lin("dense", "attention.output.dense", inner, h, True))
    mlp = [_lin("dense", "intermediate.dense", h, ffn, True), _lin("dense", "output.dense", ffn, h, True)]
    head = spec.capabilities.mlm_head_transform
    return _Block(attn, mlp, [], 0, 2 * 2 * h, 0, (_lin("dense", head, h, h, True),))


def _lm_head(spec: ModelSpec) -> LinearLayer:
    decoder = spec.capabilities.mlm_decoder
    if decoder:  # the MLM decoder; BERT's bias is cls.predictions.bias (tied)
        return _lin("decoder", decoder, spec.hidden_size, spec.vocab_size, True, 1, "lm_head")
    return _lin("lm_head", "lm_head", spec.hidden_size, spec.vocab_size, spec.lm_head_bias, 1, "lm_head")


def _other_params(spec: ModelSpec) -> int:
    """Parameters outside the blocks, embeddings, final norm and lm_head (see ParamBreakdown.other)."""
    h, caps = spec.hidden_size, spec.capabilities
    if caps.embedding_layernorm:
        return 2 * h  # word_embeddings_layernorm
    if caps.encoder_decoder:
        return 2 * spec.relative_attention_buckets * spec.num_heads  # first encoder + first decoder block
    if caps.encoder:
        # token-type embeddings, embeddings LayerNorm, head transform LayerNorm, output bias
        return spec.type_vocab_size * h + 2 * h + 2 * h + spec.vocab_size
    return 0


def _final_norm_params(spec: ModelSpec) -> int:
    if spec.capabilities.encoder:
        return 0  # post-LN: every block ends in its own LayerNorm
    if spec.capabilities.encoder_decoder:
        return 2 * spec.hidden_size  # encoder and decoder final_layer_norm (weight only)
    return _norm_params(spec, spec.hidden_size)


def _vision_linears(spec: ModelSpec) -> list[LinearLayer]:
    v = spec.vision
    if v is None or not spec.capabilities.vision_tower:
        return []
    merge_sq = max(1, v.patches_per_image // max(1, v.tokens_per_image))
    d, ffn, merged = v.hidden_size, v.intermediate_size, v.hidden_size * merge_sq
    n = v.num_layers
    return [
        _lin("qkv", "blocks.attn.qkv", d, 3 * d, True, n, vision=True),
        _lin("proj", "blocks.attn.proj", d, d, True, n, vision=True),
        _lin("fc1", "blocks.mlp.fc1", d, ffn, True, n, vision=True),
        _lin("fc2", "blocks.mlp.fc2", ffn, d, True, n, vision=True),
        _lin("merger.mlp.0", "merger.mlp.0", merged, merged, True, vision=True),
        _lin("merger.mlp.2", "merger.mlp.2", merged, spec.hidden_size, True, vision=True),
    ]


def vision_params(spec: ModelSpec) -> int:
    """Vision tower parameters: computed for Qwen2-VL, else the catalog's recorded figure."""
    v = spec.vision
    if v is None:
        return 0
    if not spec.capabilities.vision_tower:
        return v.params
    d = v.hidden_size
    patch = QWEN2VL_IN_CHANNELS * QWEN2VL_TEMPORAL_PATCH * v.patch_size**2 * d
    norms = v.num_layers * 2 * (2 * d) + 2 * d  # norm1/norm2 per block + merger ln_q (LayerNorms)
    return patch + norms + sum(layer.params for layer in _vision_linears(spec))


@_per_spec
def linear_layers(spec: ModelSpec) -> tuple[LinearLayer, ...]:
    """Every linear module (and fused expert slice) of the model, with its whole-model count."""
    b = _block(spec)
    n = spec.num_layers
    out = [_scaled(layer, n) for layer in b.attention + b.mlp + b.experts] + list(b.extra)
    # The lm_head exists as a module even when its weight is tied to the embeddings.
    out.append(_lm_head(spec))
    return tuple(out + _vision_linears(spec))


def _scaled(layer: LinearLayer, layers: int) -> LinearLayer:
    return LinearLayer(layer.name, layer.path, layer.in_features, layer.out_features,
                       layer.count * layers, layer.bias, layer.vision, layer.kind)


@_per_spec
def count_params(spec: ModelSpec) -> ParamBreakdown:
    """Exact parameter count of `spec` as transformers builds it (tied weights counted once)."""
    b = _block(spec)
    h, n, v = spec.hidden_size, spec.num_layers, spec.vocab_size
    attention = sum(x.params for x in b.attention) + b.attention_extra
    mlp = sum(x.params for x in b.mlp)
    experts = sum(x.params for x in b.experts if x.kind == "expert")
    cross = other = 0
    if spec.capabilities.encoder_decoder:
        # The feed-forward linears are listed per side (their paths differ); per block they are alike.
        mlp = (3 if spec.gated_mlp else 2) * h * spec.intermediate_size
        cross = sum(x.params for x in b.extra if "EncDecAttention" in x.path) + spec.decoder_layers * h
    elif b.extra:
        other = sum(x.params for x in b.extra)  # the MLM head transform
    other += _other_params(spec)
    embedding = v * h
    position = spec.max_position_embeddings * h if spec.position == "learned" else 0
    # An untied BERT / RoBERTa MLM decoder keeps its own bias next to the head's (counted in other).
    head_bias = spec.lm_head_bias or spec.capabilities.encoder
    lm_head = 0 if spec.tie_embeddings else v * h + (v if head_bias else 0)
    final_norm = _final_norm_params(spec)
    vision = vision_params(spec)
    per_layer = attention + mlp + b.norms + b.router + experts
    total = embedding + position + lm_head + n * per_layer + final_norm + vision + cross + other
    inactive = 0
    if spec.num_experts:
        per_expert = experts // spec.num_experts
        inactive = n * (spec.num_experts - spec.experts_per_token) * per_expert
    return ParamBreakdown(
        embedding=embedding, position_embedding=position, lm_head=lm_head, num_layers=n,
        attention_per_layer=attention, mlp_per_layer=mlp, norms_per_layer=b.norms,
        router_per_layer=b.router, experts_per_layer=experts, final_norm=final_norm, vision=vision,
        total=total, active_per_token=total - vision - inactive, cross_attention=cross, other=other,
    )


def total_params(spec: ModelSpec) -> int:
    """The exact count from safetensors headers when known, else the computed total."""
    return spec.exact_params if spec.exact_params is not None else count_params(spec).total


def _matches(layer: LinearLayer, key: str) -> bool:
    # PEFT matches a target key against the end of the module path at a dot boundary.
    return layer.name == key or layer.path == key or layer.path.endswith("." + key)


def canonical_targets(target_modules: list[str] | tuple[str, ...] | str) -> list[str] | str:
    """LoRA target_modules as PEFT takes them: the string "all-linear", or a list of names.

    LoraSettings.target_modules holds either a list of names or the bare string "all-linear"
    (what --lora-targets and a YAML `target_modules: all-linear` give). Iterating the bare string
    split it into characters ('a', 'l', 'l', '-', ...): every consumer goes through here instead.
    A list that names "all-linear" means all-linear; another bare string is one module name.
    """
    if isinstance(target_modules, str):
        return "all-linear" if target_modules.strip().lower() == "all-linear" else [target_modules]
    names = list(target_modules)
    if any(isinstance(x, str) and x.strip().lower() == "all-linear" for x in names):
        return "all-linear"
    return names


LLAMA_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def attention_module_names(spec: ModelSpec) -> list[str]:
    """The attention projections of one block as PEFT target keys: the module name, or its path
    where other linears share the name (BERT's attention.output.dense vs intermediate.dense).
    T5's names also match its decoder cross-attention, as PEFT's own t5 default (q, v) does."""
    block = _block(spec)
    others = {x.name for x in block.mlp + list(block.extra) if "EncDecAttention" not in x.path}
    return list(dict.fromkeys(x.path if x.name in others else x.name for x in block.attention))


def lora_targets(spec: ModelSpec, target_modules: list[str] | str,
                 target_parameters: list[str] | None = None) -> list[LinearLayer]:
    """The layers LoRA adapts for PEFT's `target_modules` (or "all-linear") and `target_parameters`.

    "all-linear" follows PEFT: every nn.Linear / Conv1D module, vision tower included, except
    the output layer (lm_head); fused MoE experts are parameters, not modules, so they are only
    included for Mixtral and Qwen3-MoE, where PEFT maps the transformers-4 names onto them.
    """
    return [layer for layer, _ in lora_plan(spec, target_modules, target_parameters)]


def lora_plan(spec: ModelSpec, target_modules: list[str] | str,
              target_parameters: list[str] | None) -> list[tuple[LinearLayer, int]]:
    """(layer, rank multiplier) pairs; the multiplier is 2 where PEFT fuses two targets."""
    layers = linear_layers(spec)
    modules = [x for x in layers if x.kind in ("linear", "lm_head")]
    params = [x for x in layers if x.kind in ("expert", "router")]
    v4_names, fused_pair = dict(spec.capabilities.peft_v4_names), spec.capabilities.peft_v4_fused_pair
    target_modules = canonical_targets(target_modules)
    if target_modules == list(LLAMA_ATTENTION) and not all(any(x.name == n for x in modules) for n in LLAMA_ATTENTION):
        # LoraSettings' default (q, k, v, o) means "the attention projections": on a model that
        # names them differently (c_attn, query_key_value, query/key/value/dense, q/k/v/o), use
        # its own, as PEFT's per-architecture defaults do.
        target_modules = attention_module_names(spec)
    if target_modules == "all-linear":
        keys = [x.name for x in modules if x.kind != "lm_head"] + list(v4_names)
        target_modules = list(dict.fromkeys(keys))
    plan: list[tuple[LinearLayer, int]] = []
    unknown = []
    v4_keys = [k for k in target_modules if k in v4_names]
    if v4_keys and (fused_pair[0] in v4_keys) != (fused_pair[1] in v4_keys):
        raise BadInputError(f"lora target_modules: {spec.architecture}'s {fused_pair[0]} and {fused_pair[1]} are fused "
                            "into experts.gate_up_proj; target both or neither")
    for key in target_modules:
        if key in v4_keys:
            layer = next(x for x in params if x.path == v4_names[key])
            mult = 2 if key in fused_pair else 1  # PEFT doubles the rank of the fused pair
            if all(p is not layer for p, _ in plan):
                plan.append((layer, mult))
            continue
        hits = [x for x in modules if _matches(x, key)]
        if not hits:
            unknown.append(key)
        plan += [(x, 1) for x in hits if all(p is not x for p, _ in plan)]
    if unknown:
        fused = sorted({x.name for x in params if any(_matches(x, k) for k in unknown)})
        hint = f"valid names: {', '.join(module_names(spec))}, or 'all-linear'"
        if fused:
            hint += ("; fused MoE weights (" + ", ".join(fused) + ") are parameters: pass them as target_parameters")
        raise BadInputError(
            f"lora target_modules: {', '.join(map(repr, unknown))} not found in {spec.id}", hint=hint
        )
    for layer in _param_targets(spec, params, target_parameters or []):
        if all(p is not layer for p, _ in plan):
            plan.append((layer, 1))
    return plan


def _param_targets(spec: ModelSpec, experts: list[LinearLayer], keys: list[str]) -> list[LinearLayer]:
    chosen = []
    for key in keys:
        key = key.removesuffix(".weight")  # the router is addressed as "gate.weight"
        hits = [x for x in experts if _matches(x, key)]
        if not hits:
            valid = sorted({x.path for x in experts})
            raise BadInputError(
                f"lora target_parameters: {key!r} not found in {spec.id}",
                hint=f"valid names: {', '.join(valid) if valid else 'none (the model has no fused experts)'}",
            )
        chosen += [x for x in hits if x not in chosen]
    return chosen


# Linear modules that read the attention output or the MLP's inner width (not a norm output).
_OUTPUT_PROJECTIONS = ("o_proj", "dense", "c_proj", "down_proj", "fc2", "dense_4h_to_h", "o", "wo")
_ATTENTION_PARTS = ("self_attn", "attn", "attention", "self_attention", "SelfAttention", "EncDecAttention")


def lora_position(layer: LinearLayer) -> str:
    """Where an adapted linear sits in its block, for the activation model: "attn_in" / "attn_out" /
    "mlp_in" / "mlp_out", or "lm_head" for the output layer and heads outside the blocks."""
    parts = layer.path.split(".")
    if layer.kind == "lm_head" or parts[0] in ("cls", "lm_head"):
        return "lm_head"
    part = "attn" if any(p in _ATTENTION_PARTS for p in parts[:-1]) else "mlp"
    out = layer.name in _OUTPUT_PROJECTIONS and layer.path != "intermediate.dense"
    return f"{part}_{'out' if out else 'in'}"


def norm_readers(spec: ModelSpec) -> tuple[int, int]:
    """(linear modules reading the attention-norm output, those reading the MLP-norm output):
    q, k, v: 3; a fused qkv: 1; gate + up: 2. Phi's one LayerNorm feeds q, k, v and fc1."""
    caps = spec.capabilities
    if caps.parallel_block:
        return 4, 0
    attn = 1 if caps.fused_qkv else 3
    mlp = 2 if (spec.gated_mlp and not caps.fused_gate_up) else 1
    return attn, mlp


def module_names(spec: ModelSpec) -> list[str]:
    """Distinct module names PEFT `target_modules` can name, in model order."""
    seen: list[str] = []
    for layer in linear_layers(spec):
        if layer.kind in ("linear", "lm_head") and layer.name not in seen:
            seen.append(layer.name)
    seen += [k for k, _ in spec.capabilities.peft_v4_names if k not in seen]
    return seen


def lora_params(spec: ModelSpec, target_modules: list[str] | str, rank: int,
                target_parameters: list[str] | None = None) -> int:
    """Trainable LoRA parameters: rank x (in + out) per adapted module (no LoRA bias).

    Source: LoRA (Hu et al. 2021, arXiv:2106.09685) A is r x in, B is out x r; PEFT's
    ParamWrapper gives fused experts one A of (r*E) x in and one B of out x (r*E).
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise BadInputError(f"lora rank must be a positive integer, got {rank!r}")
    return sum(adapter_params(x, rank, mult) for x, mult in lora_plan(spec, target_modules, target_parameters))


def adapter_params(layer: LinearLayer, rank: int, mult: int = 1) -> int:
    """LoRA parameters on one target over the model: A (r x in) and B (out x r) per instance, the rank
    times `mult` where PEFT fuses two targets (lora_plan)."""
    return layer.count * rank * mult * (layer.in_features + layer.out_features)
