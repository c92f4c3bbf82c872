"""config.json -> ModelSpec fields for the families whose configs do not use Llama's key names:
Falcon, GPTBigCode (SantaCoder / StarCoder), BLOOM, Qwen v1 (remote code, read, never run),
T5 / mT5 and BERT / RoBERTa.

Each reader applies the defaults transformers' configuration_<arch>.py applies when a key is
absent (transformers 5: models/falcon/configuration_falcon.py, models/gpt_bigcode/...,
models/bloom/..., models/t5/..., models/mt5/..., models/bert/..., models/roberta/...; Qwen v1:
https://huggingface.co/Qwen/Qwen-7B/blob/main/configuration_qwen.py). `cfg` is model_loader's
_Cfg, which names the file and the key in every error. model_loader imports this module (never
the other way round); `activation` and ACTIVATIONS are shared with it.
"""

from __future__ import annotations

from typing import Any, Callable

from trainfit.errors import BadInputError, short_repr

# config.json activation names -> ModelSpec's (transformers' ACT2FN names they stand for).
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_new": "gelu_new", "relu": "relu"}


def activation(cfg, key: str, default: str) -> str:
    """The ModelSpec activation a config key names (any other gelu variant: gelu)."""
    name = cfg.get(key, default)
    if not isinstance(name, str):
        raise BadInputError(f"{cfg.origin}: key '{key}' must be a string, got {short_repr(name)}")
    if name in ACTIVATIONS:
        return ACTIVATIONS[name]
    if name.startswith("gelu"):
        return "gelu"
    raise BadInputError(f"{cfg.origin}: key '{key}': activation {short_repr(name)} is not supported",
                        hint=f"supported: {', '.join(ACTIVATIONS)}")


def _heads(cfg, hidden: int, heads: int) -> int:
    if hidden % heads:
        raise BadInputError(f"{cfg.origin}: hidden size {hidden} is not a multiple of the {heads} attention heads",
                            hint="transformers needs hidden_size = heads x head_dim")
    return hidden // heads


def _first_int(cfg, keys: tuple[str, ...], default: int | None = None) -> int:
    for key in keys:
        if cfg.get(key) is not None:
            return cfg.int(key)
    if default is None:
        raise BadInputError(f"{cfg.origin}: missing key '{keys[0]}'")
    return default


def falcon_fields(cfg) -> dict[str, Any]:
    # FalconConfig attribute_map: n_layer / n_head are the older names of the same keys.
    hidden = _first_int(cfg, ("hidden_size", "n_embed"), 4544)
    layers = _first_int(cfg, ("num_hidden_layers", "n_layer"), 32)
    heads = _first_int(cfg, ("num_attention_heads", "n_head"), 71)
    new_arch = cfg.bool("new_decoder_architecture", False)
    parallel = cfg.bool("parallel_attn", True)
    if new_arch:
        kv = _first_int(cfg, ("num_kv_heads", "n_head_kv"), heads)
    elif cfg.bool("multi_query", True):
        kv = 1
    else:
        kv = heads  # query_key_value is 3 x hidden: every head has its own key and value
    # FalconDecoderLayer: sequential blocks have input + post-attention LayerNorms; parallel ones
    # have one, or ln_attn + ln_mlp when num_ln_in_parallel_attn is 2 (the new-architecture default).
    n_ln = cfg.get("num_ln_in_parallel_attn")
    if n_ln is None and new_arch:
        n_ln = 2
    norms = 2 if (not parallel or n_ln == 2) else 1
    bias = cfg.bool("bias", False)
    return dict(
        vocab_size=cfg.int("vocab_size", 65024), hidden_size=hidden, num_layers=layers, num_heads=heads,
        num_kv_heads=kv, head_dim=_heads(cfg, hidden, heads),
        intermediate_size=cfg.int("ffn_hidden_size", 4 * hidden), activation=activation(cfg, "activation", "gelu"),
        gated_mlp=False, tie_embeddings=cfg.bool("tie_word_embeddings", True),
        position="alibi" if cfg.bool("alibi", False) else "rope",
        max_position_embeddings=cfg.int("max_position_embeddings", 2048), norm="layernorm",
        qkv_bias=bias, o_bias=bias, mlp_bias=bias, lm_head_bias=False,
        parallel_attention=parallel or new_arch, block_norms=norms,
    )


def gpt_bigcode_fields(cfg) -> dict[str, Any]:
    hidden, heads = cfg.int("n_embd", 768), cfg.int("n_head", 12)
    return dict(
        vocab_size=cfg.int("vocab_size", 50257), hidden_size=hidden, num_layers=cfg.int("n_layer", 12),
        num_heads=heads, num_kv_heads=1 if cfg.bool("multi_query", True) else heads,
        head_dim=_heads(cfg, hidden, heads), intermediate_size=cfg.int("n_inner", 4 * hidden),
        activation=activation(cfg, "activation_function", "gelu_pytorch_tanh"), gated_mlp=False,
        tie_embeddings=cfg.bool("tie_word_embeddings", True), position="learned",
        max_position_embeddings=cfg.int("n_positions", 1024), norm="layernorm",
        qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=False,
    )


def bloom_fields(cfg) -> dict[str, Any]:
    # BloomConfig: n_embed is the older name of hidden_size; n_layer / n_head have attribute_map
    # aliases num_hidden_layers / num_attention_heads. The MLP is always 4 x hidden (BloomMLP).
    hidden = _first_int(cfg, ("hidden_size", "n_embed"), 64)
    heads = _first_int(cfg, ("n_head", "num_attention_heads"), 8)
    return dict(
        vocab_size=cfg.int("vocab_size", 250880), hidden_size=hidden,
        num_layers=_first_int(cfg, ("n_layer", "num_hidden_layers"), 2), num_heads=heads, num_kv_heads=heads,
        head_dim=_heads(cfg, hidden, heads), intermediate_size=4 * hidden, activation="gelu_tanh",
        gated_mlp=False, tie_embeddings=cfg.bool("tie_word_embeddings", True), position="alibi",
        # ALiBi has no learned positions; seq_length is the pretraining context where published.
        max_position_embeddings=cfg.int("seq_length", 2048), norm="layernorm",
        qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=False,
    )


def qwen_fields(cfg) -> dict[str, Any]:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    kv_channels = cfg.int("kv_channels", hidden // heads)
    ffn = cfg.int("intermediate_size")
    if ffn % 2:
        raise BadInputError(f"{cfg.origin}: key 'intermediate_size' ({ffn}) must be even: Qwen's w1 and w2 "
                            "are intermediate_size / 2 wide")
    no_bias = cfg.bool("no_bias", True)
    return dict(
        vocab_size=cfg.int("vocab_size"), hidden_size=hidden, num_layers=cfg.int("num_hidden_layers"),
        num_heads=heads, num_kv_heads=heads, head_dim=kv_channels, intermediate_size=ffn // 2,
        activation="silu", gated_mlp=True, tie_embeddings=cfg.bool("tie_word_embeddings", False),
        position="rope", max_position_embeddings=cfg.int("seq_length", cfg.int("max_position_embeddings", 8192)),
        norm="rmsnorm", qkv_bias=True, o_bias=not no_bias, mlp_bias=not no_bias, lm_head_bias=False,
    )


def t5_fields(cfg) -> dict[str, Any]:
    # T5Config: feed_forward_proj "relu" | "gated-gelu" | "gated-silu" ...; the decoder has
    # num_layers blocks unless num_decoder_layers says otherwise. transformers >= 5 ties lm_head
    # to the shared embedding always (configuration_t5.py: "we tie weights always"), so the
    # checkpoint's tie_word_embeddings=false (mT5, T5 v1.1) no longer adds a separate lm_head.
    proj = cfg.get("feed_forward_proj", "relu")
    if not isinstance(proj, str) or len(proj.split("-")) > 2 or (proj.count("-") and not proj.startswith("gated-")):
        raise BadInputError(f"{cfg.origin}: key 'feed_forward_proj': {proj!r} is not a valid activation",
                            hint="'relu', 'gelu' or 'gated-gelu' / 'gated-silu'")
    gated = proj.startswith("gated-")
    act_name = proj.split("-")[-1]
    act = "gelu_new" if act_name == "gelu" and gated else act_name  # T5Config: gated-gelu runs gelu_new
    if act not in ACTIVATIONS:
        raise BadInputError(f"{cfg.origin}: key 'feed_forward_proj': activation {act_name!r} is not supported",
                            hint=f"supported: {', '.join(ACTIVATIONS)}")
    encoder = cfg.int("num_layers", 6)
    decoder = cfg.int("num_decoder_layers", encoder)
    heads = cfg.int("num_heads", 8)
    return dict(
        vocab_size=cfg.int("vocab_size", 32128), hidden_size=cfg.int("d_model", 512), num_layers=encoder + decoder,
        num_heads=heads, num_kv_heads=heads, head_dim=cfg.int("d_kv", 64), intermediate_size=cfg.int("d_ff", 2048),
        activation=ACTIVATIONS[act], gated_mlp=gated, tie_embeddings=True, position="none",
        # Relative positions: no learned table bounds the length; n_positions where published.
        max_position_embeddings=cfg.int("n_positions", 512), norm="rmsnorm",
        qkv_bias=False, o_bias=False, mlp_bias=False, lm_head_bias=False,
        decoder_layers=decoder, relative_attention_buckets=cfg.int("relative_attention_num_buckets", 32),
    )


def bert_fields(cfg) -> dict[str, Any]:
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        raise BadInputError(f"{cfg.origin}: key 'position_embedding_type': only 'absolute' is supported")
    hidden, heads = cfg.int("hidden_size", 768), cfg.int("num_attention_heads", 12)
    types = cfg.get("type_vocab_size", 2)
    if isinstance(types, bool) or not isinstance(types, int) or types < 0:
        raise BadInputError(f"{cfg.origin}: key 'type_vocab_size' must be a non-negative integer, got {types!r}")
    return dict(
        vocab_size=cfg.int("vocab_size", 30522), hidden_size=hidden, num_layers=cfg.int("num_hidden_layers", 12),
        num_heads=heads, num_kv_heads=heads, head_dim=_heads(cfg, hidden, heads),
        intermediate_size=cfg.int("intermediate_size", 3072), activation=activation(cfg, "hidden_act", "gelu"),
        gated_mlp=False, tie_embeddings=cfg.bool("tie_word_embeddings", True), position="learned",
        max_position_embeddings=cfg.int("max_position_embeddings", 512), norm="layernorm",
        # The MLM decoder's bias is a separate parameter (cls.predictions.bias), counted with the head.
        qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=False, type_vocab_size=types,
    )


FAMILY_FIELDS: dict[str, Callable[[Any], dict[str, Any]]] = {
    "falcon": falcon_fields, "gpt_bigcode": gpt_bigcode_fields, "bloom": bloom_fields, "qwen": qwen_fields,
    "t5": t5_fields, "mt5": t5_fields, "bert": bert_fields, "roberta": bert_fields,
}
