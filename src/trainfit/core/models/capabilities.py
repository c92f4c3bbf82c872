"""What each supported architecture does differently, as named capabilities: the one table keyed
by architecture (transformers' model_type).

Part of the family loaders (with model_loader.py and model_loader_families.py): this table is the
only place outside them where an architecture's name decides anything. Every other module reads
`spec.capabilities.<field>` (ModelSpec.capabilities, not serialised), so a quirk is one field here
plus the formula that reads it, and a new architecture is one row. Where a ModelSpec field already
says it (parallel_attention, num_experts, vision, decoder_layers), that field is read instead.

Sources: transformers' models/<type>/modeling_<type>.py and configuration_<type>.py (5.x unless
noted), PEFT's transformers_weight_conversion.py, torchtune 0.6.1's model builders, LLaMA-Factory
0.9.5's templates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

# Which layout function of core/models/params.py lists a block's modules (transformers' module names).
BlockLayout = Literal[
    "llama_like",  # q/k/v/o_proj + gate/up/down_proj, dense or mixture of experts
    "qkv_proj_gate_up_proj",  # fused qkv_proj and gate_up_proj (Phi-3)
    "parallel_dense_fc",  # q/k/v_proj + dense, fc1/fc2, one LayerNorm for both (Phi-1/2)
    "conv1d_c_attn",  # Conv1D c_attn / c_proj / c_fc (GPT-2; PEFT's fan_in_fan_out)
    "neox_query_key_value",  # attention.query_key_value + dense_h_to_4h (GPT-NeoX)
    "self_attention_query_key_value",  # self_attention.query_key_value + dense_h_to_4h (Falcon, BLOOM)
    "c_attn_c_fc",  # nn.Linear c_attn / c_proj / c_fc (GPTBigCode)
    "c_attn_w1_w2",  # c_attn / c_proj + gated w1, w2, c_proj (Qwen v1)
    "t5_stack",  # encoder and decoder stacks (T5 / mT5)
    "bert_encoder",  # post-LN encoder blocks + MLM head (BERT / RoBERTa)
]
# (config key, transformers' default) of one dropout role; None where the model has none.
DropoutKey = tuple[str, float] | None


@dataclass(frozen=True)
class ModelCapabilities:
    """One architecture's differences. Defaults describe "none of these quirks"."""

    supported: bool = False  # trainfit has a layer layout for it (count_params, memory, speed)
    buildable: bool = False  # `trainfit train` builds it from a ModelSpec (train/hf_config.py)
    block_layout: BlockLayout = "llama_like"
    moe: bool = False  # experts in every block (catalog entries must give num_experts)
    encoder: bool = False  # encoder-only with an MLM head, post-LN blocks, no final norm
    encoder_decoder: bool = False  # encoder + decoder stacks (decoder_layers of num_layers)
    vision_tower: bool = False  # a vision tower trainfit computes (Qwen2-VL's ViT and merger)
    # Attention and MLP always read one LayerNorm's output (phi): no config switch, unlike
    # ModelSpec.parallel_attention (falcon, gpt_neox).
    parallel_block: bool = False
    # Norms per block where ModelSpec.block_norms leaves it to the architecture (Gemma-2 / Gemma 3
    # add pre/post feed-forward norms: 4; phi's one shared LayerNorm: 1).
    norms_per_block: int = 2
    # RMSNorm of queries and keys: per head (Qwen3: q_norm / k_norm of head_dim each) or over the
    # whole projection (OLMo 2: heads x head_dim and kv heads x head_dim).
    qk_norm: Literal["none", "per_head", "whole_projection"] = "none"
    # Gemma's RMSNorm, y * (1 + weight) in fp32, keeps the fp32 y: always (Gemma, Gemma-2; LitGPT's
    # norm does not), or only for its weight's gradient (Gemma 3, measured on CPU).
    norm_fp32_output: Literal["none", "always", "when_weight_trains"] = "none"
    fused_qkv: bool = False  # one module projects q, k and v: one reader of the attention norm
    fused_gate_up: bool = False  # one module projects gate and up: one reader of the MLP norm
    embedding_layernorm: bool = False  # a LayerNorm right after the word embeddings (BLOOM)
    # The MLM head's modules (BERT: cls.predictions.*, RoBERTa: lm_head.*); "" for causal LMs.
    mlm_head_transform: str = ""
    mlm_decoder: str = ""
    # Soft-capping, cap * tanh(x / cap): of the final logits (final_logit_softcapping) and of the
    # attention scores (attn_logit_softcapping, eager attention only) (Gemma-2).
    logit_softcap: bool = False
    attention_softcap: bool = False
    # transformers refuses SDPA / flash attention (soft-capping; BloomPreTrainedModel has no SDPA path).
    eager_attention_only: bool = False
    # Sliding-window attention in every other layer, full attention in the rest (Gemma-2).
    alternating_sliding_window: bool = False
    # Falcon's attention: multi-query keys go to SDPA with one head, which only its math path
    # broadcasts; grouped keys / values are broadcast (copied) to every query head before SDPA;
    # ALiBi goes to SDPA as a float mask.
    sdpa_mqa_math_fallback: bool = False
    kv_broadcast_before_sdpa: bool = False
    alibi_sdpa_mask: bool = False
    # A parallel block drops out the attention + MLP sum once, not each branch (Falcon).
    parallel_shares_hidden_dropout: bool = False
    # The saved v is a view of the fused q+k+v output and keeps all of it: when there are no key
    # groups to repeat (GPT-NeoX), or always, SDPA repeating groups itself (Phi-3).
    fused_qkv_v_view: Literal["never", "no_kv_groups", "always"] = "never"
    o_proj_copy: bool = False  # o_proj reads a contiguous copy of the attention output (Phi-3)
    # Eager attention keeps its softmax in the input dtype, where the others upcast to fp32 (GPT-2).
    eager_probs_in_input_dtype: bool = False
    # transformers < 4.53 lets use_cache stay on under gradient checkpointing (4.48.1: GPTBigCode).
    cache_under_checkpointing: bool = False
    # transformers <= 4.48 ran CrossEntropyLoss in the model's own forward on the shifted 16-bit
    # logits, with no fp32 upcast (modeling_<type>.py "shift_logits = lm_logits[..., :-1, :]").
    own_forward_16bit_loss: bool = False
    # PEFT (>= 0.18) maps these transformers-4 expert module names onto the fused experts
    # (peft/utils/transformers_weight_conversion.py); the pair is fused (rank doubled, both required).
    peft_v4_names: tuple[tuple[str, str], ...] = ()
    peft_v4_fused_pair: tuple[str, ...] = ()
    # The model's own dropout as (hidden, attention, embedding) config keys (core/models/dropout_config.py).
    dropout_keys: tuple[DropoutKey, DropoutKey, DropoutKey] = (None, None, None)
    # Building a transformers config from a ModelSpec (train/hf_config.py):
    hf_head_dim_derived: bool = False  # the attention derives head_dim = hidden / heads (no head_dim key)
    hf_no_grouped_query: bool = False  # num_kv_heads must equal num_heads
    hf_activation_key: str = "hidden_act"  # Gemma's configs: hidden_activation
    hf_attention_bias: bool = False  # an attention_bias key
    hf_mlp_bias: bool = False  # an mlp_bias key
    hf_sliding_window: bool = False  # a sliding_window key
    # Qwen configs carry a window but use it only with use_sliding_window (read and written so).
    sliding_window_switch: bool = False
    hf_query_pre_attn_scalar: bool = False  # query_pre_attn_scalar = head_dim (Gemma-2)
    hf_sliding_window_default: int = 0  # the window written when the spec has none (Gemma-2: 4096)
    # How the config names experts: num_local_experts (Mixtral), num_experts + moe_intermediate_size
    # (Qwen3-MoE), and a shared expert's width (Qwen2-MoE).
    hf_moe_keys: Literal["none", "num_local_experts", "num_experts", "num_experts_shared"] = "none"
    hf_n_embd_keys: bool = False  # GPT-2's n_embd / n_layer / n_head / n_inner key names
    # Export hints: torchtune's component builder (torchtune.models.<builder>; checkpointer model_type
    # is its upper case) and LLaMA-Factory's chat template when the family has none of its own.
    torchtune_builder: str = ""
    llama_factory_template: str = ""


UNKNOWN = ModelCapabilities()

_LLAMA_DROPOUT: tuple[DropoutKey, DropoutKey, DropoutKey] = (None, ("attention_dropout", 0.0), None)
_GPT2_DROPOUT: tuple[DropoutKey, DropoutKey, DropoutKey] = (("resid_pdrop", 0.1), ("attn_pdrop", 0.1),
                                                            ("embd_pdrop", 0.1))
# BERT's embeddings dropout uses hidden_dropout_prob too.
_BERT_DROPOUT: tuple[DropoutKey, DropoutKey, DropoutKey] = (
    ("hidden_dropout_prob", 0.1), ("attention_probs_dropout_prob", 0.1), ("hidden_dropout_prob", 0.1))
# PEFT's transformers-4 names of Mixtral's experts: gate -> router, w1 + w3 -> experts.gate_up_proj
# (rank doubled), w2 -> experts.down_proj (_MOE_TARGET_MODULE_MAPPING, _MOE_FUSED_TARGETS).
MIXTRAL_V4_NAMES = (("gate", "mlp.gate"), ("w1", "mlp.experts.gate_up_proj"), ("w3", "mlp.experts.gate_up_proj"),
                    ("w2", "mlp.experts.down_proj"))
# PEFT (>= 0.21) maps Qwen3-MoE's the same way (its table files qwen3_moe under qwen2_moe, whose v4
# names are the router "gate" and the experts' gate/up/down_proj; Qwen2-MoE itself is not remapped:
# its gate/up/down_proj are the shared expert's).
QWEN3_MOE_V4_NAMES = (("gate", "mlp.gate"), ("gate_proj", "mlp.experts.gate_up_proj"),
                      ("up_proj", "mlp.experts.gate_up_proj"), ("down_proj", "mlp.experts.down_proj"))

# Llama-shaped blocks: q/k/v/o projections + gated MLP + RMSNorm. Granite (IBM Granite 3.x, PowerLM)
# adds scalar multipliers on the embeddings, residual branches, attention scores and logits: no
# parameters, nothing saved for backward.
_LLAMA = ModelCapabilities(supported=True, buildable=True, dropout_keys=_LLAMA_DROPOUT)
_QWEN2 = replace(_LLAMA, hf_sliding_window=True, sliding_window_switch=True)
_GEMMA = replace(_LLAMA, norm_fp32_output="always", hf_activation_key="hidden_activation", hf_attention_bias=True)
# Decoder-only families with a fused query_key_value / c_attn projection, estimated but not built
# (Qwen v1: the published remote-code modeling_qwen.py, never run here).
_FUSED = ModelCapabilities(supported=True, fused_qkv=True)
_T5 = ModelCapabilities(supported=True, block_layout="t5_stack", encoder_decoder=True,
                        dropout_keys=(("dropout_rate", 0.1),) * 3)
_BERT = ModelCapabilities(supported=True, block_layout="bert_encoder", encoder=True, dropout_keys=_BERT_DROPOUT)

# Keyed by transformers' model_type; the order is the one error messages list them in.
CAPABILITIES: dict[str, ModelCapabilities] = {
    "llama": replace(_LLAMA, hf_attention_bias=True, hf_mlp_bias=True, torchtune_builder="llama3_2"),
    "mistral": replace(_LLAMA, hf_sliding_window=True),
    "qwen2": replace(_QWEN2, torchtune_builder="qwen2", llama_factory_template="qwen"),
    "qwen3": replace(_QWEN2, qk_norm="per_head", hf_attention_bias=True, llama_factory_template="qwen"),
    "gemma": _GEMMA,
    "gemma2": replace(_GEMMA, norms_per_block=4, logit_softcap=True, attention_softcap=True,
                      eager_attention_only=True, alternating_sliding_window=True, hf_sliding_window=True,
                      hf_query_pre_attn_scalar=True, hf_sliding_window_default=4096),
    "qwen2_vl": replace(_QWEN2, vision_tower=True),
    "granite": _LLAMA,
    "smollm3": replace(_LLAMA, hf_attention_bias=True),
    "olmo2": replace(_LLAMA, qk_norm="whole_projection", hf_attention_bias=True),
    "gemma3_text": replace(_GEMMA, norms_per_block=4, qk_norm="per_head", norm_fp32_output="when_weight_trains"),
    "mixtral": replace(_LLAMA, moe=True, hf_sliding_window=True, hf_moe_keys="num_local_experts",
                       peft_v4_names=MIXTRAL_V4_NAMES, peft_v4_fused_pair=("w1", "w3")),
    "qwen2_moe": replace(_QWEN2, moe=True, hf_moe_keys="num_experts_shared"),
    "qwen3_moe": replace(_QWEN2, moe=True, qk_norm="per_head", hf_attention_bias=True, hf_moe_keys="num_experts",
                         peft_v4_names=QWEN3_MOE_V4_NAMES, peft_v4_fused_pair=("gate_proj", "up_proj")),
    "phi": ModelCapabilities(supported=True, buildable=True, block_layout="parallel_dense_fc", parallel_block=True,
                             norms_per_block=1, hf_head_dim_derived=True,
                             dropout_keys=(("resid_pdrop", 0.0), ("attention_dropout", 0.0), ("embd_pdrop", 0.0))),
    # Phi3Model applies no embedding dropout (embd_pdrop is in its config, unused).
    "phi3": ModelCapabilities(supported=True, buildable=True, block_layout="qkv_proj_gate_up_proj", fused_qkv=True,
                              fused_gate_up=True, fused_qkv_v_view="always", o_proj_copy=True,
                              hf_head_dim_derived=True, hf_sliding_window=True,
                              dropout_keys=(("resid_pdrop", 0.0), ("attention_dropout", 0.0), None)),
    "gpt2": ModelCapabilities(supported=True, buildable=True, block_layout="conv1d_c_attn", fused_qkv=True,
                              eager_probs_in_input_dtype=True, hf_head_dim_derived=True, hf_no_grouped_query=True,
                              hf_n_embd_keys=True, dropout_keys=_GPT2_DROPOUT),
    # GPTNeoXModel's emb_dropout uses hidden_dropout too.
    "gpt_neox": ModelCapabilities(supported=True, buildable=True, block_layout="neox_query_key_value", fused_qkv=True,
                                  fused_qkv_v_view="no_kv_groups", own_forward_16bit_loss=True,
                                  hf_head_dim_derived=True, hf_no_grouped_query=True, hf_attention_bias=True,
                                  dropout_keys=(("hidden_dropout", 0.0), ("attention_dropout", 0.0),
                                                ("hidden_dropout", 0.0))),
    # Rotary falcon passes dropout_p=0.0 to SDPA and drops nothing in eager attention (only its flash
    # and ALiBi paths use attention_dropout): the attention probabilities are not counted.
    "falcon": replace(_FUSED, block_layout="self_attention_query_key_value", sdpa_mqa_math_fallback=True,
                      kv_broadcast_before_sdpa=True, alibi_sdpa_mask=True, parallel_shares_hidden_dropout=True,
                      own_forward_16bit_loss=True, dropout_keys=(("hidden_dropout", 0.0), None, None)),
    "gpt_bigcode": replace(_FUSED, block_layout="c_attn_c_fc", cache_under_checkpointing=True,
                           own_forward_16bit_loss=True, dropout_keys=_GPT2_DROPOUT),
    "bloom": replace(_FUSED, block_layout="self_attention_query_key_value", embedding_layernorm=True,
                     eager_attention_only=True, own_forward_16bit_loss=True,
                     dropout_keys=(("hidden_dropout", 0.0), ("attention_dropout", 0.0), None)),
    "qwen": replace(_FUSED, block_layout="c_attn_w1_w2",
                    dropout_keys=(None, ("attn_dropout_prob", 0.0), ("emb_dropout_prob", 0.0))),
    "t5": _T5,
    "mt5": _T5,
    "bert": replace(_BERT, mlm_head_transform="cls.predictions.transform.dense", mlm_decoder="cls.predictions.decoder"),
    "roberta": replace(_BERT, mlm_head_transform="lm_head.dense", mlm_decoder="lm_head.decoder"),
}

SUPPORTED_ARCHITECTURES = tuple(CAPABILITIES)
# What `trainfit train` can build from a ModelSpec; the others are estimated, not built.
BUILDABLE_ARCHITECTURES = tuple(arch for arch, caps in CAPABILITIES.items() if caps.buildable)
TORCHTUNE_ARCHITECTURES = tuple(arch for arch, caps in CAPABILITIES.items() if caps.torchtune_builder)


def capabilities_of(architecture: object) -> ModelCapabilities:
    """The capabilities of a model_type; UNKNOWN (supported=False, no quirks) for any other value."""
    return CAPABILITIES.get(architecture, UNKNOWN) if isinstance(architecture, str) else UNKNOWN
