"""`--lora-targets all-linear`: the bare string "all-linear" is never iterated
as a list of module names; every consumer of LoraSettings.target_modules reads it through
params.canonical_targets."""

import json
import subprocess
import sys

import pytest

from trainfit.core.models.catalog import get_model
from trainfit.core.models.params import canonical_targets, lora_params
from trainfit.core.setup import LoraSettings, TrainingSetup


def _estimate(*args):
    return subprocess.run([sys.executable, "-m", "trainfit", "estimate", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_all_linear_estimates_and_counts_every_linear():
    r = _estimate("qwen2.5-0.5b", "--method", "lora", "--lora-targets", "all-linear", "--lora-r", "8", "--json")
    assert r.returncode in (0, 3), r.stderr  # fits or not: either way an estimate, not bad input
    assert "'a', 'l', 'l'" not in r.stderr
    doc = json.loads(r.stdout)
    expected = lora_params(get_model("qwen2.5-0.5b"), ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                        "up_proj", "down_proj"], 8)
    assert doc["params_trainable"] == expected == 4_399_104


def test_cli_new_family_all_linear():
    r = _estimate("bert-base-uncased", "--method", "lora", "--lora-targets", "all-linear", "--json")
    assert r.returncode in (0, 3), r.stderr
    assert json.loads(r.stdout)["params_trainable"] == lora_params(get_model("bert-base-uncased"), "all-linear", 16)


@pytest.mark.parametrize("given, canonical", [
    ("all-linear", "all-linear"), ("ALL-LINEAR ", "all-linear"), (["all-linear"], "all-linear"),
    (("q_proj", "v_proj"), ["q_proj", "v_proj"]), ("q_proj", ["q_proj"]), ([], []),
])
def test_canonical_targets(given, canonical):
    assert canonical_targets(given) == canonical


def test_every_consumer_takes_the_bare_string():
    from trainfit.core.speed import flops
    from trainfit.core.speed.cpu import trainable_tensors

    spec = get_model("qwen2.5-0.5b")
    lora = LoraSettings(rank=8, target_modules="all-linear")  # type: ignore[arg-type]
    setup = TrainingSetup(method="lora", lora=lora, device="cpu", precision="fp32")
    expected = lora_params(spec, "all-linear", 8)
    assert flops.lora_params_per_token(spec, "all-linear", 8) == expected
    assert flops.step_flops(spec, setup).forward_flops > 0
    assert sum(e * c for e, c in trainable_tensors(spec, setup)) == expected


def test_peft_kwargs_keep_all_linear_a_string():
    from trainfit.export.peft_config import lora_config_kwargs
    from trainfit.config.run_config import parse_run_config

    cfg = parse_run_config({"version": 1, "method": "lora", "model": {"shape": {"layers": 2, "hidden": 64, "heads": 4}},
                            "data": {"paths": ["builtin:tiny-chat"]}, "schedule": {"max_steps": 1},
                            "training": {"lora": {"target_modules": ["all-linear"]}}}, source="test.yaml")
    assert lora_config_kwargs(cfg)["target_modules"] == "all-linear"
