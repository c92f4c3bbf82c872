"""Method variants and their fallback order: the one rule for "which method if the asked one
does not fit". A variant is a method plus how the weights are held: "dpo+lora" is DPO with LoRA
adapters (the reference model is the base with adapters off), "inference+nf4" serves 4-bit weights
(core.setup.parse_variant reads the names).

Fallback keeps the user's method first, then gives up the least: full weights -> LoRA on a 16-bit
base -> QLoRA (4-bit NF4 base with double quantisation, Dettmers et al. 2023). Pretraining has
no fallback (adapters need pretrained weights).
"""

from __future__ import annotations

from trainfit.core.plan.hardware_rules import DeviceRules
from trainfit.core.plan.intent import resolve_setup
from trainfit.core.machines.profile import HardwareProfile
from trainfit.core.setup import LoraSettings, TrainingSetup, parse_variant

FALLBACK = {
    "full": ("full", "lora", "qlora"), "lora": ("lora", "qlora"), "qlora": ("qlora",),
    "dpo": ("dpo", "dpo+lora", "dpo+qlora"), "pretrain": ("pretrain",),
    "inference": ("inference", "inference+int8", "inference+nf4"),
    "auto": ("full", "lora", "qlora"),
}
LABELS = {"full": "full fine-tuning", "lora": "LoRA", "qlora": "QLoRA", "dpo": "DPO (full weights)",
          "dpo+lora": "DPO with LoRA", "dpo+qlora": "DPO with QLoRA", "pretrain": "pretraining",
          "inference": "inference", "inference+int8": "inference with 8-bit weights",
          "inference+nf4": "inference with 4-bit NF4 weights"}


def chain(method: str, *, fallback: bool = True) -> tuple[str, ...]:
    """The variants to try for `method`, in order (only the method itself without fallback)."""
    return FALLBACK[method] if fallback else FALLBACK[method][:1]


def uses_adapters(variant: str) -> bool:
    """LoRA / QLoRA, SFT or DPO: the variants whose adapters' targets can change."""
    return parse_variant(variant).adapters


def needs_bitsandbytes(variant: str) -> bool:
    """QLoRA and 8- / 4-bit inference: every quantised variant's weights are bitsandbytes'."""
    return parse_variant(variant).quant != "none"


def base_setup(variant: str, hw: HardwareProfile, rules: DeviceRules, *, seq_len: int, lora: LoraSettings,
               num_gpus: int | None = None) -> TrainingSetup:
    """The variant on this hardware with everything else at its default (the search varies the rest)."""
    v = parse_variant(variant)
    n = num_gpus if num_gpus is not None else (rules.gpus if rules.device != "cpu" else 1)
    return resolve_setup(hw, v.method, lora=lora if v.adapters else None, device=rules.device, num_gpus=max(1, n),
                         quant=v.quant, seq_len=seq_len)
