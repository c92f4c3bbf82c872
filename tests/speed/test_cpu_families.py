"""The CPU step-time terms for families and paths beyond Llama (trainfit.core.speed.cpu):
emulated 16-bit matmuls, Gemma-2 soft-capping, mixture-of-experts routing. Their sizes are
checked against timed steps in bench/step_time_accuracy.py; these are the directions."""

import dataclasses

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.shapes import shape_from_dims
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.core.speed import cpu_rates
from trainfit.core.speed.cpu import cpu_step
from trainfit.core.speed.flops import step_flops

SPEC = shape_from_dims(4, 256, 8, 8192)
BASE = TrainingSetup(method="full", precision="bf16-mixed", micro_batch=2, seq_len=256, device="cpu")
LORA = dataclasses.replace(BASE, method="lora", lora=LoraSettings(rank=8))


def _rates(bf16_share: float):
    rates = cpu_rates(resolve_hardware("cpu"))
    fp32 = rates.peak_flops["fp32"]
    return dataclasses.replace(rates, peak_flops={**rates.peak_flops, "bf16": fp32 * bf16_share})


def _step(setup, rates, spec=SPEC, precision="bf16"):
    return cpu_step(spec, setup, rates, step_flops(spec, setup), precision, rates.peak_flops[precision])


def test_emulated_bf16_lora_costs_almost_what_full_training_does():
    # Without bf16 instructions the input gradient dominates, and frozen weights still need it.
    emulated = _rates(0.02)
    assert _step(LORA, emulated).gemm_seconds > 0.85 * _step(BASE, emulated).gemm_seconds
    native = _rates(2.0)
    assert _step(LORA, native).gemm_seconds < 0.75 * _step(BASE, native).gemm_seconds


def test_emulated_bf16_recompute_is_cheap_and_the_path_is_slow():
    emulated = _rates(0.02)
    ckpt = dataclasses.replace(BASE, grad_checkpointing="full")
    assert _step(ckpt, emulated).gemm_seconds < 1.1 * _step(BASE, emulated).gemm_seconds
    assert _step(BASE, emulated).gemm_seconds > 10 * _step(BASE, _rates(2.0)).gemm_seconds


def test_gemma2_soft_capping_adds_vocabulary_sized_tensors():
    spec = dataclasses.replace(SPEC, vocab_size=256000)
    setup = dataclasses.replace(BASE, precision="fp32", micro_batch=1)
    rates = _rates(2.0)
    plain = _step(setup, rates, dataclasses.replace(spec, architecture="llama"), "fp32")
    capped = _step(setup, rates, dataclasses.replace(spec, architecture="gemma2"), "fp32")
    assert capped.vocabulary_seconds > 2 * plain.vocabulary_seconds
    assert capped.first_touch_seconds > 2 * plain.first_touch_seconds


def test_moe_routing_costs_eager_ops_per_expert():
    setup = dataclasses.replace(BASE, precision="fp32")
    rates = _rates(2.0)
    dense = _step(setup, rates, precision="fp32")
    moe = _step(setup, rates, dataclasses.replace(SPEC, num_experts=8, experts_per_token=2), "fp32")
    assert moe.dispatch_seconds > 2 * dense.dispatch_seconds
