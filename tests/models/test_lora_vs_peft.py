"""lora_params equals the trainable parameters PEFT creates, on tiny random models."""

import pytest

pytest.importorskip("peft")

from trainfit.core.models.catalog import get_model  # noqa: E402
from trainfit.core.models.params import lora_params, module_names  # noqa: E402
from trainfit.errors import BadInputError  # noqa: E402
from trainfit.train.hf_config import build_model, shrink  # noqa: E402

CASES = [
    ("llama3.1-8b", ["q_proj", "v_proj"]),
    ("llama3.1-8b", "all-linear"),
    ("qwen2.5-0.5b", ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    ("qwen3-0.6b", "all-linear"),
    ("gemma-2-2b", ["o_proj", "down_proj"]),
    ("phi-2", ["q_proj", "k_proj", "v_proj", "dense", "fc1", "fc2"]),
    ("phi-3-mini", ["qkv_proj", "gate_up_proj"]),
    ("gpt2", ["c_attn", "c_proj"]),
    ("gpt2", "all-linear"),
    ("pythia-70m", ["query_key_value", "dense", "dense_h_to_4h"]),
    ("mixtral-8x7b", "all-linear"),
    ("mixtral-8x7b", ["q_proj", "w1", "w3"]),
    ("mixtral-8x7b", ["gate", "w2"]),
    ("qwen1.5-moe-a2.7b", "all-linear"),
    ("qwen2-vl-2b", "all-linear"),
    ("qwen2-vl-2b", ["q_proj", "v_proj", "qkv"]),
    ("smollm2-135m", ["lm_head", "q_proj"]),
]


def _peft_trainable(spec, target_modules, rank, target_parameters=None):
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = build_model(spec, device="cpu")
    kwargs = {"target_parameters": target_parameters} if target_parameters else {}
    if target_parameters and target_modules == []:
        kwargs["target_modules"] = []
    else:
        kwargs["target_modules"] = target_modules
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, **kwargs))
    return sum(p.numel() for p in peft_model.parameters() if p.requires_grad)


@pytest.mark.parametrize("name,targets", CASES, ids=[f"{n}-{t if isinstance(t, str) else '+'.join(t)}"
                                                      for n, t in CASES])
def test_lora_params_match_peft(name, targets):
    spec = shrink(get_model(name))
    assert lora_params(spec, targets, 8) == _peft_trainable(spec, targets, 8)


def test_fused_expert_parameters_match_peft_target_parameters():
    spec = shrink(get_model("mixtral-8x7b"))
    params = ["experts.gate_up_proj", "experts.down_proj"]
    assert lora_params(spec, [], 4, target_parameters=params) == _peft_trainable(spec, [], 4, params)


def test_unknown_target_lists_valid_names():
    spec = get_model("llama3.1-8b")
    with pytest.raises(BadInputError) as err:
        lora_params(spec, ["q_proj", "c_attn"], 16)
    msg = str(err.value)
    assert "'c_attn'" in msg and "q_proj" in msg and "all-linear" in msg
    assert module_names(get_model("gpt2")) == ["c_attn", "c_proj", "c_fc", "lm_head"]


def test_expert_weights_named_as_modules_point_to_target_parameters():
    with pytest.raises(BadInputError, match="target_parameters"):
        lora_params(get_model("mixtral-8x7b"), ["gate_up_proj"], 8)
    with pytest.raises(BadInputError, match="w1 and w3"):
        lora_params(get_model("mixtral-8x7b"), ["w1"], 8)


def test_qwen_moe_router_via_target_parameters():
    spec = shrink(get_model("qwen1.5-moe-a2.7b"))
    params = ["gate.weight", "experts.down_proj"]
    assert lora_params(spec, [], 4, target_parameters=params) == _peft_trainable(spec, [], 4, params)


def test_rank_must_be_positive():
    with pytest.raises(BadInputError, match="rank"):
        lora_params(get_model("gpt2"), "all-linear", 0)


def test_known_lora_figure():
    # Llama-3-8B, r=16 on q/k/v/o: 32 layers x 16 x ((4096+4096) + 2 x (4096+1024) + (4096+4096))
    # = 13,631,488 (the "trainable params: 13,631,488" PEFT prints for this setup).
    assert lora_params(get_model("llama3-8b"), ["q_proj", "k_proj", "v_proj", "o_proj"], 16) == 13_631_488
