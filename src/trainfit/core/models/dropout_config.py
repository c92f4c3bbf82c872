"""A model's own dropout probabilities, as its config.json names them.

Many older checkpoints train with dropout on (GPT-2, SantaCoder/StarCoder, BERT, T5: 0.1; Phi-2's
residual dropout 0.1), and Transformers' Trainer and TRL's SFTTrainer keep it on in training.
Each dropout that runs keeps state for its backward (core/memory/model_dropout.py), so the
probabilities are part of the ModelSpec: read from config.json here, written back into the
config `trainfit train` builds (train/hf_config.py), so estimate and run describe one model.

Three roles, one config key (and transformers' default when the key is absent) per role and
model_type (ModelCapabilities.dropout_keys in core/models/capabilities.py), read from each
configuration_<arch>.py (transformers 5.x; Qwen v1: the remote-code configuration_qwen.py):
* hidden: the dropout on a block's attention and MLP outputs before the residual add;
* attention: on the attention probabilities (inside the fused kernel on CUDA);
* embedding: on the embeddings' output, before the first block.
"""

from __future__ import annotations

from typing import Any

from trainfit.core.models.capabilities import capabilities_of

FIELDS = ("hidden_dropout", "attention_dropout", "embedding_dropout")


def _keys(model_type: str) -> list[tuple[str, str, float]]:
    """(ModelSpec field, config key, default) of each dropout the architecture applies."""
    entries = capabilities_of(model_type).dropout_keys
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
