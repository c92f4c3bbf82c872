"""Exact parameter count of any architecture transformers ships, without weights or remote code.

For a config.json whose model_type trainfit has no layer layout for, the refusal can still say
how many parameters the model has: transformers builds it on the meta device (shapes only, no
memory, no compute) from its own configuration class. Configs that need trust_remote_code
(auto_map) are never built. Without transformers installed there is no count (None).
"""

from __future__ import annotations

from typing import Any

# What building an arbitrary architecture from a config can raise (bad values, missing extras).
_BUILD_ERRORS = (ValueError, TypeError, KeyError, AttributeError, IndexError, RuntimeError, NotImplementedError,
                 ImportError)
# Heads transformers builds for a model_type, tried in this order (the first that maps it wins).
_AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModelForMaskedLM", "AutoModel")


def meta_param_count(config: dict[str, Any]) -> tuple[int, str] | None:
    """(parameters, transformers class) of the model `config` describes, or None when transformers
    is missing, the model_type is unknown to it, the config needs remote code, or it cannot be built."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or "auto_map" in config:
        return None
    try:
        import torch
        import transformers
        from transformers import CONFIG_MAPPING
    except ImportError:
        return None
    if model_type not in CONFIG_MAPPING:
        return None
    kwargs = {k: v for k, v in config.items() if k not in ("model_type", "auto_map", "architectures")}
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **kwargs)
    except _BUILD_ERRORS:  # a config its own class rejects: no count rather than a crash
        return None
    for name in _AUTO_CLASSES:
        auto = getattr(transformers, name)
        try:
            with torch.device("meta"):
                model = auto.from_config(hf_config)
        except (ValueError, KeyError):  # this head is not mapped for the model_type
            continue
        except _BUILD_ERRORS:
            return None
        return sum(p.numel() for p in model.parameters()), type(model).__name__
    return None
