"""Shared helpers for the architecture fixtures in tests/models/fixtures/: load a shipped
config.json, shrink it to a tiny model of the same family, build it with transformers.

`shrunk(name)` keeps every key that changes the layout (multi_query, parallel_attn, bias,
feed_forward_proj, type_vocab_size, ...) and only makes the widths, depths and vocabulary small,
so a tiny model builds in milliseconds and trains a step in well under a second on a CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRANSFORMERS_FAMILIES = ("falcon-7b", "gpt_bigcode-santacoder", "bloom-560m", "t5-small", "mt5-small",
                         "bert-base-uncased", "roberta-base", "granite-3.3-8b-instruct")

# Size keys per model_type -> tiny values (same layout, small shapes).
_TINY: dict[str, dict[str, Any]] = {
    "falcon": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=512),
    "gpt_bigcode": dict(n_embd=64, n_head=4, n_layer=2, n_inner=256, vocab_size=512, n_positions=256),
    "bloom": dict(hidden_size=64, n_head=4, n_layer=2, vocab_size=512),
    "t5": dict(d_model=64, d_kv=16, num_heads=4, d_ff=128, num_layers=2, vocab_size=512),
    "mt5": dict(d_model=64, d_kv=16, num_heads=4, d_ff=96, num_layers=2, num_decoder_layers=3, vocab_size=512),
    "bert": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=256,
                 vocab_size=512, max_position_embeddings=256),
    "roberta": dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=256,
                    vocab_size=512, max_position_embeddings=258),
    "granite": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                    intermediate_size=160, vocab_size=512, max_position_embeddings=256),
    # head_dim stays explicit (64 with 4 heads: queries wider than the hidden size, as in Qwen3)
    "qwen3_moe": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=2,
                      intermediate_size=320, moe_intermediate_size=96, num_experts=4, num_experts_per_tok=2,
                      vocab_size=512, max_position_embeddings=256),
    "olmo2": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                  intermediate_size=320, vocab_size=512, max_position_embeddings=256),
    "gemma3_text": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_hidden_layers=2,
                        intermediate_size=320, vocab_size=512, max_position_embeddings=256, sliding_window=512),
    "smollm3": dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
                    intermediate_size=320, vocab_size=512, max_position_embeddings=256),
}


def config(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def shrunk(name: str, **overrides: Any) -> dict[str, Any]:
    cfg = config(name)
    cfg.update(_TINY[cfg["model_type"]])
    for key in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "decoder_start_token_id"):
        if isinstance(cfg.get(key), int) and cfg[key] >= cfg["vocab_size"]:
            cfg[key] = 0
    cfg.update(overrides)
    return cfg


def auto_class(model_type: str):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    return {"t5": AutoModelForSeq2SeqLM, "mt5": AutoModelForSeq2SeqLM, "bert": AutoModelForMaskedLM,
            "roberta": AutoModelForMaskedLM}.get(model_type, AutoModelForCausalLM)


def build(cfg: dict[str, Any], *, device: str = "meta", attention: str | None = None, dtype: str = "float32"):
    """The transformers model of `cfg`; fp32 unless `dtype` says otherwise (from_config would
    otherwise follow the config's torch_dtype, e.g. falcon-7b's bfloat16)."""
    import torch
    from transformers import AutoConfig

    kw = {k: v for k, v in cfg.items() if k not in ("model_type", "auto_map")}
    hf = AutoConfig.for_model(cfg["model_type"], **kw)
    extra = {"attn_implementation": attention} if attention else {}
    extra["dtype"] = getattr(torch, dtype)
    with torch.device(device):
        return auto_class(cfg["model_type"]).from_config(hf, **extra)
