"""Closed forms of the FLOPs and power models."""

import dataclasses

import pytest

from trainfit.core.run.power import energy_kwh, gpu_draw_watts, step_activity
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.core.speed import step_flops
from trainfit.core.speed.flops import matmul_params_per_token
from trainfit.core.speed.types import SpeedEstimate
from trainfit.errors import BadInputError

from .conftest import LLAMA2_7B


def test_training_is_three_forwards_and_6n_per_token():
    setup = TrainingSetup(method="full", micro_batch=2, seq_len=128, attention="flash")
    f = step_flops(LLAMA2_7B, setup)
    assert f.backward_flops == pytest.approx(2 * f.forward_flops)
    n = matmul_params_per_token(LLAMA2_7B)
    assert 6.6e9 < n < 6.8e9  # Llama-2-7B: 6.74B params minus the 131M embedding lookup
    # Short sequences: attention is small, so ~6 N per token.
    assert f.total_flops / f.tokens == pytest.approx(6 * n, rel=0.02)


def test_lora_skips_weight_gradients_and_checkpointing_adds_a_forward():
    lora = LoraSettings(rank=16, target_modules=["q_proj", "v_proj"])
    full = step_flops(LLAMA2_7B, TrainingSetup(method="full", seq_len=64))
    lo = step_flops(LLAMA2_7B, TrainingSetup(method="lora", lora=lora, seq_len=64))
    assert lo.total_flops / full.total_flops == pytest.approx(4 / 6, rel=0.02)
    ck = step_flops(LLAMA2_7B, TrainingSetup(method="lora", lora=lora, seq_len=64, grad_checkpointing="full"))
    assert ck.recompute_flops == pytest.approx(lo.forward_flops)


def test_dpo_runs_two_sequences_and_a_reference_forward():
    base = step_flops(LLAMA2_7B, TrainingSetup(method="full", micro_batch=1, seq_len=256))
    dpo = step_flops(LLAMA2_7B, TrainingSetup(method="dpo", micro_batch=1, seq_len=256))
    assert dpo.tokens == 2 * base.tokens
    assert dpo.total_flops == pytest.approx(2 * base.total_flops + dpo.reference_flops)
    assert dpo.reference_flops == pytest.approx(2 * base.forward_flops)
    pre = step_flops(LLAMA2_7B, TrainingSetup(method="dpo", seq_len=256, dpo_reference="precomputed"))
    assert pre.reference_flops == 0


def test_causal_flash_halves_attention_scores():
    eager = step_flops(LLAMA2_7B, TrainingSetup(seq_len=4096, attention="eager"))
    flash = step_flops(LLAMA2_7B, TrainingSetup(seq_len=4096, attention="flash"))
    attn_fwd_eager = 4 * 32 * 4096 * 4096 * 4096  # 4 L s h per token x tokens
    assert eager.forward_flops - flash.forward_flops == pytest.approx(attn_fwd_eager / 2)


def test_gpu_draw_is_linear_between_idle_and_limit():
    assert gpu_draw_watts(400, 0.0) == pytest.approx(48)
    assert gpu_draw_watts(400, 1.0) == pytest.approx(400)
    assert gpu_draw_watts(400, 0.5) == pytest.approx(224)
    with pytest.raises(BadInputError):
        gpu_draw_watts(0, 0.5)


def test_energy_and_cost_closed_form():
    # 8 GPUs at 350 W for 10 h = 28 kWh; with PUE 1.2 = 33.6 kWh.
    assert energy_kwh(8 * 350, 10 * 3600) == pytest.approx(28.0)
    assert energy_kwh(8 * 350, 10 * 3600, pue=1.2) == pytest.approx(33.6)
    with pytest.raises(BadInputError):
        energy_kwh(100, 10, pue=0.9)


def test_activity_weights_parts_by_time():
    est = SpeedEstimate(
        model_id="m", device="cuda x1", compute_precision="bf16", micro_step_seconds=1, step_seconds=1,
        tokens_per_second=1, samples_per_second=1, step_flops=1, achieved_tflops_per_device=1, mfu=0.5,
        matmul_efficiency=0.5, seconds_by_part={"compute": 3.0, "memory bandwidth": 1.0}, bottleneck="compute",
    )  # fmt: skip
    assert step_activity(est) == pytest.approx((3 * 1.0 + 1 * 0.7) / 4)
    idle = dataclasses.replace(est, seconds_by_part={"compute": 0.0})
    assert step_activity(idle) == 0.0
