"""ModelSpec -> transformers config, and `shrink` to build tiny models of any architecture.

`build_hf_config(spec)` reproduces the architecture of a catalog entry, a loaded config.json or
a pretraining shape, so that `AutoModelForCausalLM.from_config(...)` (or the VLM class) builds a
model with exactly `count_params(spec).total` parameters. Fields that do not change shapes
(rope theta, norm eps, soft-capping) keep transformers' defaults for that architecture.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainfit.core.models.dropout_config import config_kwargs as dropout_config_kwargs
from trainfit.core.models.capabilities import BUILDABLE_ARCHITECTURES
from trainfit.core.models.spec import ModelSpec, VisionTowerSpec
from trainfit.core.models.params import QWEN2VL_TEMPORAL_PATCH, vision_params
from trainfit.errors import BadInputError, require_extra

# ModelSpec activation -> the name transformers' ACT2FN uses.
_ACT = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu", "gelu_new": "gelu_new"}


def _check(spec: ModelSpec) -> None:
    caps = spec.capabilities
    if not caps.buildable:
        # Falcon, GPTBigCode, BLOOM, Qwen v1, T5 and BERT are estimated (trainfit.core.models.params)
        # but not built from a ModelSpec here.
        raise BadInputError(
            f"model {spec.id!r}: architecture {spec.architecture!r} cannot be built by trainfit's trainer "
            "(it is supported by estimate / plan / cloud)",
            hint=f"trainable architectures: {', '.join(BUILDABLE_ARCHITECTURES)}",
        )
    if caps.hf_head_dim_derived and spec.head_dim * spec.num_heads != spec.hidden_size:
        raise BadInputError(
            f"model {spec.id!r}: {spec.architecture} needs head_dim * num_heads == hidden_size "
            f"({spec.head_dim} * {spec.num_heads} != {spec.hidden_size})"
        )
    if caps.hf_no_grouped_query and spec.num_kv_heads != spec.num_heads:
        raise BadInputError(f"model {spec.id!r}: {spec.architecture} has no grouped-query attention "
                            f"(num_kv_heads must equal num_heads)")


def _text_kwargs(spec: ModelSpec) -> dict[str, Any]:
    kw: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_embeddings,
    )
    caps = spec.capabilities
    if not caps.hf_head_dim_derived:
        kw["head_dim"] = spec.head_dim
    act = _ACT[spec.activation]
    kw[caps.hf_activation_key] = act
    if caps.hf_attention_bias:
        kw["attention_bias"] = spec.qkv_bias
    if caps.hf_mlp_bias:
        kw["mlp_bias"] = spec.mlp_bias
    if caps.hf_sliding_window:
        kw["sliding_window"] = spec.sliding_window
        if caps.sliding_window_switch:
            kw["use_sliding_window"] = spec.sliding_window is not None
    if caps.hf_query_pre_attn_scalar:
        kw["query_pre_attn_scalar"] = spec.head_dim
    if caps.hf_sliding_window_default:
        kw["sliding_window"] = spec.sliding_window or caps.hf_sliding_window_default
    if caps.hf_moe_keys == "num_local_experts":
        kw["num_local_experts"] = spec.num_experts
        kw["num_experts_per_tok"] = spec.experts_per_token
        kw["intermediate_size"] = spec.moe_intermediate_size or spec.intermediate_size
    if caps.hf_moe_keys == "num_experts_shared":
        kw.update(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                  moe_intermediate_size=spec.moe_intermediate_size or spec.intermediate_size,
                  shared_expert_intermediate_size=spec.shared_experts * (spec.moe_intermediate_size or 0),
                  decoder_sparse_step=1, mlp_only_layers=[])
    if caps.hf_moe_keys == "num_experts":
        kw.update(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token,
                  moe_intermediate_size=spec.moe_intermediate_size or spec.intermediate_size,
                  decoder_sparse_step=1, mlp_only_layers=[])
    if caps.hf_n_embd_keys:
        kw = dict(vocab_size=spec.vocab_size, n_positions=spec.max_position_embeddings, n_embd=spec.hidden_size,
                  n_layer=spec.num_layers, n_head=spec.num_heads, n_inner=spec.intermediate_size,
                  activation_function=act, tie_word_embeddings=spec.tie_embeddings)
    kw.update(dropout_config_kwargs(spec))  # the model's own dropout, as the estimate counts it
    return kw


_TOKEN_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "image_token_id", "video_token_id",
               "vision_start_token_id", "vision_end_token_id", "vision_token_id")


def _token_ids(model_type: str, vocab: int) -> dict[str, int]:
    """Special token ids clamped into a (tiny, shrunk) vocabulary; the architecture's defaults
    otherwise. Passed at construction so transformers does not warn about out-of-range ids."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    out = {}
    for key in _TOKEN_KEYS:
        value = getattr(cls, key, None)
        if isinstance(value, int) and value >= vocab:
            out[key] = vocab - 1
    return out


def build_hf_config(spec: ModelSpec):
    """A transformers PretrainedConfig that builds the architecture `spec` describes."""
    require_extra("transformers", "train")
    _check(spec)
    from transformers import AutoConfig

    kw = _text_kwargs(spec)
    if spec.capabilities.vision_tower:
        v = spec.vision
        if v is None:
            raise BadInputError(f"model {spec.id!r}: qwen2_vl needs a vision tower (key 'vision')")
        merge = _merge_size(v)
        if v.intermediate_size % v.hidden_size:
            raise BadInputError("vision: intermediate_size must be a multiple of hidden_size (mlp_ratio)")
        vision = dict(depth=v.num_layers, embed_dim=v.hidden_size, hidden_size=spec.hidden_size,
                      mlp_ratio=v.intermediate_size // v.hidden_size, num_heads=v.num_heads,
                      patch_size=v.patch_size, spatial_merge_size=merge,
                      temporal_patch_size=QWEN2VL_TEMPORAL_PATCH)
        tie = kw.pop("tie_word_embeddings")
        kw.update(_token_ids("qwen2_vl_text", spec.vocab_size))
        return AutoConfig.for_model("qwen2_vl", text_config=kw, vision_config=vision, tie_word_embeddings=tie,
                                    **_token_ids("qwen2_vl", spec.vocab_size))
    return AutoConfig.for_model(spec.architecture, **kw, **_token_ids(spec.architecture, spec.vocab_size))


def _merge_size(v: VisionTowerSpec) -> int:
    ratio = v.patches_per_image // max(1, v.tokens_per_image)
    merge = int(round(ratio**0.5))
    if merge * merge != ratio:
        raise BadInputError("vision: patches_per_image / tokens_per_image must be a square (spatial merge)")
    return merge


def build_model(spec: ModelSpec, *, device: str = "meta", dtype: str | None = None):
    """Build the transformers model of `spec` with random weights (meta device by default)."""
    require_extra("torch", "train")
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = build_hf_config(spec)
    auto = AutoModelForImageTextToText if spec.capabilities.vision_tower else AutoModelForCausalLM
    kwargs = {"dtype": getattr(torch, dtype)} if dtype else {}
    with torch.device(device):
        return auto.from_config(cfg, **kwargs)


def shrink(spec: ModelSpec, layers: int = 2, hidden: int = 64, *, heads: int = 4, vocab: int = 512,
           intermediate: int | None = None, experts: int | None = None,
           max_positions: int = 256) -> ModelSpec:
    """A tiny ModelSpec with the same features: GQA ratio, gated MLP, tied embeddings, biases,
    MoE (experts and top-k, capped), sliding window, vision tower, norm kind."""
    group = max(1, spec.num_heads // max(1, spec.num_kv_heads))
    if heads % group:
        heads = group  # keep grouped-query attention: one KV head shared by `group` query heads
    kv = heads // group
    if hidden % heads:
        hidden = heads * 16  # transformers checks hidden % heads == 0 even with an explicit head_dim
    head_dim = hidden // heads
    # Keep head_dim > hidden/heads where the original does (Gemma-2 head_dim 256 > 2304/8).
    if spec.head_dim * spec.num_heads > spec.hidden_size and not spec.capabilities.hf_head_dim_derived:
        head_dim *= 2
    ratio = spec.intermediate_size / spec.hidden_size
    ffn = intermediate or max(8, int(round(hidden * ratio / 8)) * 8)
    n_exp = min(spec.num_experts, experts or 4) if spec.num_experts else 0
    moe_ffn = None
    if spec.moe_intermediate_size is not None:
        moe_ffn = max(8, int(round(hidden * spec.moe_intermediate_size / spec.hidden_size / 8)) * 8)
    vision = None
    if spec.vision is not None:
        vd = 32
        merge_sq = spec.vision.patches_per_image // max(1, spec.vision.tokens_per_image)
        vision = VisionTowerSpec(params=0, hidden_size=vd, num_layers=1, num_heads=2,
                                 intermediate_size=vd * spec.vision.intermediate_size // spec.vision.hidden_size,
                                 patch_size=spec.vision.patch_size, tokens_per_image=4,
                                 patches_per_image=4 * merge_sq)
    small = dataclasses.replace(
        spec, id=f"tiny:{spec.id}", vocab_size=vocab, hidden_size=hidden, num_layers=layers,
        num_heads=heads, num_kv_heads=kv, head_dim=head_dim, intermediate_size=ffn,
        num_experts=n_exp, experts_per_token=min(spec.experts_per_token, n_exp),
        moe_intermediate_size=moe_ffn, max_position_embeddings=max_positions,
        sliding_window=None if spec.sliding_window is None else min(spec.sliding_window, max_positions // 2),
        vision=vision, exact_params=None, aliases=[], source=f"shrink({spec.id})",
    )
    if vision is not None:
        small = dataclasses.replace(small, vision=dataclasses.replace(vision, params=vision_params(small)))
    return small
