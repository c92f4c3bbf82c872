"""Build the run's model: a pretraining shape, a catalog entry or a local directory, with random
or local weights. Every model goes through a ModelSpec when one can be made, so the memory and
speed predictions in summary.json describe exactly the model that runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainfit.config.run_config import RunConfig, shape_spec
from trainfit.core.models.spec import ModelSpec
from trainfit.errors import BadInputError, UnavailableError


@dataclass(frozen=True)
class BuiltModel:
    model: Any  # transformers PreTrainedModel (before PEFT wrapping)
    spec: ModelSpec | None  # None when no spec could be made (predictions then unavailable)
    spec_note: str  # why spec is None, or where it came from
    weights: str  # "random (initialised here, not pretrained)" or "local: <path>"
    hf_config: Any


def shape_vocab_size(cfg: RunConfig, tokenizer_tokens: int) -> int:
    """The vocabulary a pretraining shape is built with: tokenizer.vocab_size, the figure the plan
    was made for, when trainfit trains the tokenizer on the corpus, even where a small corpus
    gives the BPE fewer tokens (a 700 KB corpus stops at about 850 of 32,000): the model that
    runs is the model planned, its extra rows unused. A tokenizer given by path brings its own size."""
    if cfg.model.shape is not None and cfg.tokenizer.path is None:
        return max(tokenizer_tokens, cfg.tokenizer.vocab_size)
    return tokenizer_tokens


def short_vocabulary_note(cfg: RunConfig, tokenizer_tokens: int) -> str | None:
    """A warning when the corpus gave the BPE fewer tokens than tokenizer.vocab_size (None otherwise)."""
    planned = shape_vocab_size(cfg, tokenizer_tokens)
    if planned <= tokenizer_tokens:
        return None
    return (f"the corpus gave the byte-level BPE {tokenizer_tokens:,} of the {planned:,} tokens asked "
            f"(tokenizer.vocab_size): the model keeps {planned:,} embedding rows as planned, "
            f"{planned - tokenizer_tokens:,} of them never used; set tokenizer.vocab_size: {tokenizer_tokens} (and "
            f"plan with --vocab {tokenizer_tokens}) for the smaller model this corpus supports, or give more text")


def _spec_from_dir(path: str) -> tuple[ModelSpec | None, str]:
    try:
        from trainfit.hub import resolve_model
    except ImportError:
        return None, "trainfit.core.models.catalog is not in this build"
    try:
        return resolve_model(path), f"config.json in {path}"
    except Exception as exc:  # an unusual config must not stop training, only the prediction
        return None, f"cannot describe {path}: {exc}"


def _attn(cfg: RunConfig) -> str:
    return {"flash": "flash_attention_2"}.get(cfg.training.attention, cfg.training.attention)


def build_model(cfg: RunConfig, tokenizer, *, quantization_config: Any = None) -> BuiltModel:
    """Instantiate the model. Random weights use the run's seed, so runs are reproducible."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainfit.train.hf_config import build_hf_config

    m = cfg.model
    vocab = len(tokenizer)
    if m.shape is not None:
        spec, note = shape_spec(m.shape, shape_vocab_size(cfg, vocab)), "pretraining shape"
        hf_cfg = build_hf_config(spec)
    elif m.id is not None:
        try:
            from trainfit.hub import resolve_model
        except ImportError:
            raise UnavailableError("model.id needs the model catalog (trainfit.core.models.catalog), "
                                   "not in this build", hint="use model.shape or model.path") from None
        spec, note = resolve_model(m.id), "model catalog"
        hf_cfg = build_hf_config(spec)
    else:
        hf_cfg = AutoConfig.from_pretrained(m.path, local_files_only=True)
        spec, note = _spec_from_dir(m.path)
    text_vocab = getattr(hf_cfg.get_text_config(), "vocab_size", vocab)
    if vocab > text_vocab:
        raise BadInputError(f"tokenizer: {vocab} tokens do not fit the model's vocab_size {text_vocab}",
                            hint="lower tokenizer.vocab_size or use the model's own tokenizer (tokenizer.path)")
    hf_cfg._attn_implementation = _attn(cfg)
    if m.weights == "local":
        kwargs: dict[str, Any] = {"local_files_only": True, "attn_implementation": _attn(cfg)}
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        try:
            model = AutoModelForCausalLM.from_pretrained(m.path, **kwargs)
        except OSError as exc:
            raise BadInputError(f"model.path: no loadable weights in {m.path}: {str(exc).splitlines()[0]}",
                                hint="use weights: random to train from a random initialisation") from None
        weights = f"local: {m.path}"
    elif m.weights == "hub":
        model = _from_hub(m.id, attn_implementation=_attn(cfg), quantization_config=quantization_config)
        weights = f"hub: {m.id}"
    else:
        torch.manual_seed(cfg.schedule.seed)
        model = AutoModelForCausalLM.from_config(hf_cfg, attn_implementation=_attn(cfg))
        weights = "random (initialised here, not pretrained)"
    if m.weights == "random":
        # A random model has no token conventions of its own: take the tokenizer's.
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(tokenizer, key, None)
            if value is not None:
                setattr(model.config, key, value)
                if getattr(model, "generation_config", None) is not None:
                    setattr(model.generation_config, key, value)
    elif model.config.pad_token_id is None and tokenizer.pad_token_id is not None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return BuiltModel(model=model, spec=spec, spec_note=note, weights=weights, hf_config=hf_cfg)


def _from_hub(model_id: str, **kwargs):
    """Pretrained weights from the Hugging Face Hub (or its local cache)."""
    from transformers import AutoModelForCausalLM

    from trainfit.train.hub_access import offline_hint, offline_reason

    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    offline = offline_reason()  # one quick probe, not the Hub client's minute of retries
    try:
        return AutoModelForCausalLM.from_pretrained(model_id, local_files_only=offline is not None, **kwargs)
    except OSError as exc:
        if offline is not None:
            raise UnavailableError(f"model.id: the weights of {model_id} are not in the Hugging Face cache and the "
                                   f"Hub is not asked: {offline}", hint=offline_hint(model_id)) from None
        raise UnavailableError(f"model.id: cannot load {model_id} from the Hugging Face Hub or its cache: "
                               f"{str(exc).splitlines()[0]}",
                               hint="check the network (HF_HUB_OFFLINE), or download it and use model.path "
                                    "with weights: local") from None


def lora_config(cfg: RunConfig):
    """peft.LoraConfig from training.lora (defaults when the section is absent); the kwargs are
    trainfit.export.peft_config's, the same lora.yaml is written from."""
    from peft import LoraConfig

    from trainfit.export.peft_config import lora_config_kwargs

    return LoraConfig(**lora_config_kwargs(cfg))
