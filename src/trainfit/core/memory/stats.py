"""Per-model quantities the memory model needs, computed once per ModelSpec and cached.

The planner calls `estimate_memory` thousands of times for the same model, so everything that
depends only on the shapes (parameter groups, linear layers, LoRA sizes) is computed here once.
Parameter counts come from `trainfit.core.models.params` (exact against transformers).
"""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.core.models.spec import ModelSpec
from trainfit.core.models.params import adapter_params, count_params, linear_layers, lora_plan, lora_position, norm_readers


@dataclass(frozen=True)
class ModelStats:
    total: int
    embedding: int  # token + position embeddings (never quantised)
    lm_head: int  # 0 when tied
    norms: int  # all norm parameters
    linear: int  # parameters in linear layers and experts except lm_head (what bitsandbytes quantises)
    linear_out_rows: int  # sum of output rows of those layers (LLM.int8 keeps one fp32 scale per row)
    largest_linear: int  # elements of the largest quantisable weight (de-quantisation transient)
    experts: int  # routed experts and routers of all layers (fused 3-D parameters in transformers >= 5)
    expert_out_rows: int  # output rows of the experts counted in linear_out_rows
    largest_module: int  # elements of the largest nn.Linear weight outside the experts
    expert_weight: int  # elements of one expert's largest nn.Linear in transformers 4 (ffn x hidden)
    largest_param: int  # elements of the largest parameter tensor (embedding or lm_head usually)
    per_layer: int  # parameters of one decoder block (ZeRO-3 gathers one block at a time)
    layers: int  # decoder blocks
    attn_inputs: int  # linear modules reading the attention-norm output (q, k, v: 3; fused qkv: 1)
    mlp_inputs: int  # linear modules reading the MLP-norm output (gate, up: 2)
    ffn_width: int  # intermediate width per token (MoE: experts_per_token x expert width)
    vision: int


_CACHE: dict[int, tuple[ModelSpec, ModelStats]] = {}
_LORA_CACHE: dict[tuple, tuple[int, dict[str, int]]] = {}


def model_stats(spec: ModelSpec) -> ModelStats:
    """Shape-derived quantities of `spec`; cached by object identity (specs are frozen)."""
    hit = _CACHE.get(id(spec))
    if hit is not None and hit[0] is spec:
        return hit[1]
    stats = _compute(spec)
    if len(_CACHE) > 256:
        _CACHE.clear()
    _CACHE[id(spec)] = (spec, stats)
    return stats


def _compute(spec: ModelSpec) -> ModelStats:
    pb = count_params(spec)
    layers = [x for x in linear_layers(spec) if x.kind != "lm_head" and not x.vision]
    linear = sum(x.params for x in layers)
    rows = sum(x.count * x.out_features for x in layers)
    largest_linear = max((x.in_features * x.out_features for x in layers), default=0)
    if spec.num_experts:
        # transformers >= 5 fuses all experts of a layer into one 3-D parameter.
        largest_linear = max(largest_linear, pb.experts_per_layer)
    moe = [x for x in layers if x.kind in ("expert", "router")]
    largest_module = max((x.in_features * x.out_features for x in layers if x.kind == "linear"), default=0)
    # transformers 4 splits gate_up_proj into w1 and w3, so its largest per-expert weight is down_proj's
    expert_weight = min((x.in_features * x.out_features for x in moe if x.kind == "expert"), default=0)
    largest_param = max(largest_linear, pb.embedding, pb.lm_head)
    norms = pb.num_layers * pb.norms_per_layer + pb.final_norm
    attn_inputs, mlp_inputs = norm_readers(spec)
    if spec.num_experts:
        ffn = spec.experts_per_token * (spec.moe_intermediate_size or spec.intermediate_size)
        ffn += spec.shared_experts * (spec.moe_intermediate_size or 0)
    else:
        ffn = spec.intermediate_size
    return ModelStats(
        total=pb.total if spec.exact_params is None else spec.exact_params,
        embedding=pb.embedding + pb.position_embedding,
        lm_head=pb.lm_head,
        norms=norms,
        linear=linear,
        linear_out_rows=rows,
        largest_linear=largest_linear,
        experts=sum(x.params for x in moe),
        expert_out_rows=sum(x.count * x.out_features for x in moe),
        largest_module=largest_module,
        expert_weight=expert_weight,
        largest_param=largest_param,
        per_layer=pb.per_layer,
        layers=pb.num_layers,
        attn_inputs=attn_inputs,
        mlp_inputs=mlp_inputs,
        ffn_width=ffn,
        vision=pb.vision,
    )


def lora_stats(spec: ModelSpec, targets: list[str] | str, rank: int) -> tuple[int, dict[str, int]]:
    """(trainable LoRA params, adapted modules per block by position: attn_in, mlp_in, attn_out, mlp_out;
    "experts": adapted fused MoE expert parameters, which PEFT wraps as parameters, not as linears).

    The positions tell the activation model which saved inputs LoRA adds (see activations.py).
    Raises BadInputError for a module the model does not have (from trainfit.core.models.params).
    """
    key = (id(spec), tuple(targets) if isinstance(targets, list) else targets, rank)
    hit = _LORA_CACHE.get(key)
    if hit is not None:
        return hit
    chosen = [(x, mult) for x, mult in lora_plan(spec, targets, None) if not x.vision]
    params = sum(adapter_params(x, rank, mult) for x, mult in chosen)
    where = {"attn_in": 0, "mlp_in": 0, "attn_out": 0, "mlp_out": 0, "lm_head": 0, "experts": 0}
    for x, _ in chosen:
        where["experts" if x.kind == "expert" else lora_position(x)] += 1
    if len(_LORA_CACHE) > 1024:
        _LORA_CACHE.clear()
    _LORA_CACHE[key] = (params, where)
    return params, where
