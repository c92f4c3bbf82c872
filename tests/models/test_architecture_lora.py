"""lora_params equals the trainable parameters PEFT creates for Falcon, BLOOM, GPTBigCode, T5 /
mT5 and BERT / RoBERTa, on tiny models built from the shipped configs (same layout keys)."""


import pytest

pytest.importorskip("peft")

from trainfit.core.models.loader import spec_from_config  # noqa: E402
from trainfit.core.models.params import lora_params  # noqa: E402


from .family_fixtures import build, shrunk  # noqa: E402

CASES = [
    ("falcon-7b", {}, ["query_key_value", "dense"]),
    ("falcon-7b", {}, "all-linear"),
    ("falcon-7b", dict(new_decoder_architecture=True, num_kv_heads=2, num_attention_heads=8), "all-linear"),
    ("bloom-560m", {}, "all-linear"),
    ("bloom-560m", {}, ["query_key_value", "dense_h_to_4h"]),
    ("gpt_bigcode-santacoder", {}, ["c_attn", "c_proj"]),
    ("gpt_bigcode-santacoder", {}, "all-linear"),
    ("t5-small", {}, ["q", "v"]),
    ("t5-small", {}, "all-linear"),
    ("t5-small", {}, ["EncDecAttention.q", "wo"]),
    ("mt5-small", {}, "all-linear"),
    ("bert-base-uncased", {}, ["query", "value"]),
    ("bert-base-uncased", {}, "all-linear"),
    ("bert-base-uncased", {}, ["dense"]),
    ("roberta-base", {}, "all-linear"),
]


def _peft_trainable(cfg, targets, rank):
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = build(cfg, device="cpu")
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    return sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name, overrides, targets", CASES,
                         ids=[f"{n}-{'+'.join(t) if isinstance(t, list) else t}{'-var' if o else ''}"
                              for n, o, t in CASES])
def test_lora_params_match_peft(name, overrides, targets):
    cfg = shrunk(name, **overrides)
    assert lora_params(spec_from_config(cfg), targets, 8) == _peft_trainable(cfg, targets, 8)


@pytest.mark.parametrize("name", ["falcon-7b", "bert-base-uncased", "t5-small", "gpt_bigcode-santacoder"])
def test_default_targets_mean_the_attention_projections(name):
    # LoraSettings' default (q_proj, k_proj, v_proj, o_proj) on a model that names its attention
    # otherwise adapts that model's attention projections, counted as PEFT counts those keys.
    from trainfit.core.models.params import attention_module_names
    from trainfit.core.setup import LoraSettings

    cfg = shrunk(name)
    spec = spec_from_config(cfg)
    keys = attention_module_names(spec)
    assert lora_params(spec, LoraSettings().target_modules, 8) == _peft_trainable(cfg, keys, 8)
