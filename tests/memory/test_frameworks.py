"""Framework profiles (data/frameworks.yaml, core/frameworks.py): names and versions resolve as users
type them, each profile sets its knobs only where they apply, and each change is measured alone."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from trainfit.core import frameworks as F
from trainfit.core.frameworks import apply_framework, resolve_framework
from trainfit.core.memory import estimate_memory
from trainfit.core.knob_rules import Context, refusals
from trainfit.core.models.catalog import resolve_model
from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.errors import BadInputError

QLORA = TrainingSetup(method="qlora", quant="nf4", precision="bf16", lora=LoraSettings())
LORA_FSDP = TrainingSetup(method="lora", precision="bf16", lora=LoraSettings(), num_gpus=2, zero_stage=3,
                          fsdp_strategy="full-shard", grad_accum=4)


def test_catalog_is_complete_and_cited():
    profiles = F.catalog()
    assert F.catalog_problems(profiles) == []
    assert {"trainfit", "transformers", "trl", "peft", "accelerate-fsdp", "deepspeed", "torchtune", "litgpt",
            "axolotl", "llama-factory", "unsloth", "fsdp_qlora", "fms-hf-tuning"} <= set(profiles)
    for name in ("axolotl", "llama-factory", "unsloth"):  # known through what they build on: said so
        assert profiles[name]["builds_on"] == "trl" and profiles[name]["partial"]


def test_every_release_of_every_profile_resolves():
    for name, profile in F.catalog().items():
        for entry in profile["versions"]:
            release = str(entry["release"]).split(" ")[0]
            fw = resolve_framework(name if release == "installed" else f"{name}@{release}")
            assert fw.name == name
            for b in fw.behaviours:
                assert b.when in F.CONDITIONS and b.says and b.source


@pytest.mark.parametrize("text, name, release, versions", [
    ("trl", "trl", "1.0.0", {"transformers": "5.0.0"}),
    ("trl@0.12", "trl", "0.12", {"transformers": "4.46.3", "bitsandbytes": "0.44.1"}),
    ("TRL@0.12.2", "trl", "0.12.2", {"transformers": "4.46.3"}),
    ("transformers<4.49", "transformers", "4.48.3", {"transformers": "4.48.3"}),
    ("hf-trainer>=4.32,<4.46", "transformers", "4.45.2", {}),
    ("litgpt@0.4.9", "litgpt", "0.4.9", {"bitsandbytes": "0.42.0"}),
    ("litgpt@0.5.5", "litgpt", "0.5.5", {"bitsandbytes": "0.45.5"}),
    ("torchtune@0.3", "torchtune", "0.3", {}),
    ("fsdp-qlora", "fsdp_qlora", "2024.03", {"transformers": "4.37.2"}),
    ("fms-hf-tuning@2.6", "fms-hf-tuning", "2.6", {"transformers": "4.48.1", "bitsandbytes": "0.43.3"}),
    ("fms-hf-tuning@2.1", "fms-hf-tuning", "2.1", {"transformers": "4.45.2"}),
    ("axolotl@0.6", "axolotl", "0.6", {"transformers": "4.47.1"}),
])
def test_names_versions_and_ranges_resolve(text, name, release, versions):
    fw = resolve_framework(text)
    assert (fw.name, fw.release) == (name, release)
    assert versions.items() <= fw.versions.items()


@pytest.mark.parametrize("text, needle", [
    ("nope", "is not a known framework (valid: accelerate-fsdp, axolotl"),
    ("", "names no framework"),
    ("trl@x", "'x' is not a version or a constraint"),
    ("transformers<1", "no described release satisfies <1 (known transformers releases: 4.31.0"),
    ("litgpt@>=", "is not a version or a constraint"),
])
def test_bad_names_and_versions_say_what_is_valid(text, needle):
    with pytest.raises(BadInputError) as err:
        resolve_framework(text)
    assert err.value.message.startswith("--framework: ") and needle in err.value.message


def test_trl_012_upcasts_a_4bit_base_and_copies_the_logits():
    framed, changes = apply_framework(QLORA, resolve_framework("trl@0.12"))
    knobs = {c.knob: c for c in changes}
    assert framed.kbit_upcast and framed.logits_shift_copy and framed.autocast_16bit_weights
    assert framed.optimizer_impl == "foreach" and not framed.experts_fused
    assert "upcasts" in knobs["kbit_upcast"].says and knobs["kbit_upcast"].before is False
    # a full fine-tune has no quantised base: no cast, no autocast rule for QLoRA
    full, full_changes = apply_framework(TrainingSetup(method="full"), resolve_framework("trl@0.12"))
    assert not full.kbit_upcast and not full.autocast_16bit_weights
    assert "kbit_upcast" not in {c.knob for c in full_changes}


def test_conditions_decide_where_a_behaviour_applies():
    litgpt = resolve_framework("litgpt@0.4.9")
    framed, _ = apply_framework(LORA_FSDP, litgpt)
    assert framed.fsdp_mixed_units and framed.fsdp_no_sync and framed.model_code == "litgpt"
    one_step, _ = apply_framework(dataclasses.replace(LORA_FSDP, grad_accum=1), litgpt)
    assert not one_step.fsdp_no_sync  # no_sync only acts between accumulated micro-batches
    qlora, _ = apply_framework(QLORA, litgpt)
    assert qlora.bnb_keeps_input and qlora.quantize_lm_head and qlora.bnb_fp16_quant_state and not qlora.fsdp_mixed_units
    assert not apply_framework(QLORA, resolve_framework("litgpt@0.5.5"))[0].bnb_keeps_input  # bitsandbytes 0.44+


def test_a_tool_overrides_what_it_builds_on_only_where_its_rule_applies():
    """peft-examples' LoRA FSDP script checkpoints non-reentrantly; its QLoRA runs keep transformers 4.39's
    reentrant checkpoint around the units. fsdp_qlora checkpoints inside the units everywhere."""
    peft = resolve_framework("peft-examples")
    assert not apply_framework(LORA_FSDP, peft)[0].reentrant_checkpoint_around_fsdp_units
    sharded_qlora = dataclasses.replace(QLORA, num_gpus=2, zero_stage=3, fsdp_strategy="full-shard")
    assert apply_framework(sharded_qlora, peft)[0].reentrant_checkpoint_around_fsdp_units
    assert not apply_framework(sharded_qlora, resolve_framework("fsdp_qlora"))[0].reentrant_checkpoint_around_fsdp_units
    accelerated = apply_framework(QLORA, resolve_framework("fms-hf-tuning-accelerated-peft@2.6"))[0]
    assert not accelerated.kbit_upcast and apply_framework(QLORA, resolve_framework("fms-hf-tuning@2.6"))[0].kbit_upcast


def test_own_run_changes_nothing_and_profiles_never_set_a_refused_knob():
    assert apply_framework(QLORA, resolve_framework("trainfit")) == (QLORA, [])
    setups = [TrainingSetup(method=m, optimizer=o, quant=q, precision="bf16", lora=LoraSettings() if m != "full" else None,
                            num_gpus=2 if fsdp != "none" else 1, zero_stage=3 if fsdp != "none" else 0,
                            fsdp_strategy=fsdp, grad_accum=ga)
              for m, o, q, fsdp, ga in itertools.product(("full", "lora", "qlora"), ("adamw", "sgd"),
                                                          ("none", "nf4", "int8"), ("none", "full-shard"), (1, 4))
              if (m == "qlora") == (q != "none")]
    for name in F.framework_names():
        fw = resolve_framework(name)
        for s in setups:
            framed, _ = apply_framework(s, fw)
            assert refusals(framed, Context("model")) == [], (name, s)


def test_each_change_is_measured_alone():
    spec, hw = resolve_model("meta-llama/Llama-3.1-8B"), resolve_hardware("rtx-4090")
    framed, changes = apply_framework(QLORA, resolve_framework("trl@0.12"))
    peak = lambda s: float(estimate_memory(spec, s, hw).devices[0].needed_bytes)  # noqa: E731
    effects = dict((c.knob, b) for c, b in F.change_effects(framed, changes, peak))
    # PEFT's cast of Llama 3.1 8B's embeddings and lm_head (2 x 128256 x 4096) to fp32: about 2 GiB more
    assert 1.9 * 2**30 < effects["kbit_upcast"] < 4 * 2**30
    assert effects["logits_shift_copy"] > 0 and effects["experts_fused"] == 0  # a dense model


@pytest.mark.parametrize("tf, torch, impl", [("4.31.0", None, "for-loop"), ("4.45.2", "2.4.1", "foreach"),
                                             ("4.57.3", "2.8.0", "fused"), ("4.57.3", "2.7.1", "foreach")])
def test_hf_trainer_default_optimizer_by_release(tf, torch, impl):
    assert F.trainer_optimizer_impl(tf, torch) == impl


def test_own_run_reads_the_installed_versions():
    from importlib import metadata

    own = F.own_run(this_machine=True)
    assert own.is_own and own.versions["transformers"] == metadata.version("transformers")
    assert "with the installed" in F.describe(own) and f"transformers {own.versions['transformers']}" in F.describe(own)
    assert F.own_run(this_machine=False).versions == {}
