"""A model's own dropout probabilities, as its config.json names them.

Many older checkpoints train with dropout on (GPT-2, SantaCoder/StarCoder, BERT, T5: 0.1; Phi-2's
residual dropout 0.1), and Transformers' Trainer and TRL's SFTTrainer keep it on in training.
Each dropout that runs keeps state for its backward (core/memory/model_dropout.py), so the
probabilities are part of the ModelSpec: read from config.json here, written back into the
config `trainfit train` builds (train/hf_config.py), so estimate and run describe one model.

Three roles, one config key (and transformers' default when the key is absent) per role and
model_type, read from each configuration_<arch>.py (transformers 5.x; Qwen v1: the remote-code
configuration_qwen.py):
* hidden: the dropout on a block's attention and MLP outputs before the residual add;
* attention: on the attention probabilities (inside the fused kernel on CUDA);
* embedding: on the embeddings' output, before the first block.
"""

from __future__ import annotations

from typing import Any

_LLAMA_LIKE = (None, ("attention_dropout", 0.0), None)
# model_type -> (hidden, attention, embedding): (config key, default) or None where the model has none.
DROPOUT_KEYS: dict[str, tuple[tuple[str, float] | None, ...]] = {
    **{arch: _LLAMA_LIKE for arch in ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen2_vl",
                                      "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "granite", "smollm3",
                                      "olmo2")},
    "gpt2": (("resid_pdrop", 0.1), ("attn_pdrop", 0.1), ("embd_pdrop", 0.1)),
    "gpt_bigcode": (("resid_pdrop", 0.1), ("attn_pdrop", 0.1), ("embd_pdrop", 0.1)),
    "phi": (("resid_pdrop", 0.0), ("attention_dropout", 0.0), ("embd_pdrop", 0.0)),
    # Phi3Model applies no embedding dropout (embd_pdrop is in its config, unused).
    "phi3": (("resid_pdrop", 0.0), ("attention_dropout", 0.0), None),
    # GPTNeoXModel's emb_dropout uses hidden_dropout too.
    "gpt_neox": (("hidden_dropout", 0.0), ("attention_dropout", 0.0), ("hidden_dropout", 0.0)),
    # Rotary falcon passes dropout_p=0.0 to SDPA and drops nothing in eager attention (only its flash
    # and ALiBi paths use attention_dropout): the attention probabilities are not counted.
    "falcon": (("hidden_dropout", 0.0), None, None),
    "bloom": (("hidden_dropout", 0.0), ("attention_dropout", 0.0), None),
    "qwen": (None, ("attn_dropout_prob", 0.0), ("emb_dropout_prob", 0.0)),
    "t5": (("dropout_rate", 0.1),) * 3,
    "mt5": (("dropout_rate", 0.1),) * 3,
    # BERT's embeddings dropout uses hidden_dropout_prob too.
    "bert": (("hidden_dropout_prob", 0.1), ("attention_probs_dropout_prob", 0.1), ("hidden_dropout_prob", 0.1)),
    "roberta": (("hidden_dropout_prob", 0.1), ("attention_probs_dropout_prob", 0.1), ("hidden_dropout_prob", 0.1)),
}
FIELDS = ("hidden_dropout", "attention_dropout", "embedding_dropout")


def _keys(model_type: str) -> list[tuple[str, str, float]]:
    """(ModelSpec field, config key, default) of each dropout the architecture applies."""
    entries = DROPOUT_KEYS.get(model_type, (None, None, None))
    return [(field, *entry) for field, entry in zip(FIELDS, entries) if entry is not None]


def dropout_fields(data: dict[str, Any], model_type: str, origin: str) -> dict[str, float]:
    """ModelSpec dropout fields from a parsed config.json (absent keys: transformers' defaults)."""
    from trainfit.errors import BadInputError

    out: dict[str, float] = {}
    for field, key, default in _keys(model_type):
        value = data.get(key)
        value = default if value is None else value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise BadInputError(f"{origin}: key '{key}' must be a probability in [0, 1), got {value!r}")
        out[field] = float(value)
    return out


def config_kwargs(spec) -> dict[str, float]:
    """The config.json keys that give a built model the spec's dropout."""
    return {key: getattr(spec, field) for field, key, _ in _keys(spec.architecture)}
