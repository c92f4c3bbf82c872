"""peft.LoraConfig keyword arguments for a run config (lora.yaml, and what the runner builds)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainfit.core.setup import LoraSettings
    from trainfit.config.run_config import RunConfig


def uses_lora(cfg: RunConfig) -> bool:
    """lora and qlora train adapters; dpo does when training.lora is set."""
    from trainfit.core.setup import method_trains_adapters

    return method_trains_adapters(cfg.method, lora_given=cfg.training.lora is not None)


def lora_config_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """LoraConfig kwargs from training.lora (the LoraSettings defaults when the section is absent)."""
    from trainfit.core.setup import LoraSettings

    return lora_kwargs(cfg.training.lora or LoraSettings(), dora=cfg.training.dora)


def lora_kwargs(lo: LoraSettings, *, dora: bool = False) -> dict[str, Any]:
    """LoraConfig kwargs for these adapter settings (the runner's and the plan probe's)."""
    # PEFT takes the string "all-linear" (every linear layer but the output head), not a list;
    # a bare "all-linear" string must not be iterated (it would split into characters).
    from trainfit.core.models.params import canonical_targets

    targets = canonical_targets(lo.target_modules)
    kwargs = {"r": lo.rank, "lora_alpha": lo.alpha, "lora_dropout": lo.dropout, "target_modules": targets,
              "bias": "none", "task_type": "CAUSAL_LM"}
    if dora:
        kwargs["use_dora"] = True  # DoRA: PEFT adds a trained magnitude per output feature
    return kwargs
