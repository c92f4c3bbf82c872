"""Properties of the CPU step-time model that hold whatever its fitted constants.

The constants themselves are checked against timed steps in bench/step_time_accuracy.py.
"""

import dataclasses

import pytest

from trainfit.core.hardware_spec import resolve_hardware
from trainfit.core.model_shapes import shape_from_dims
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.core.speed import cpu_rates, predict_step
from trainfit.core.speed.cpu import cpu_step, fresh_bytes

HW = resolve_hardware("cpu")
SPEC = shape_from_dims(4, 256, 8, 8192)
BASE = TrainingSetup(method="full", precision="fp32", micro_batch=2, seq_len=256, device="cpu")


def _seconds(**changes) -> float:
    return predict_step(SPEC, dataclasses.replace(BASE, **changes), HW).step_seconds


def test_parts_add_up_to_the_step():
    est = predict_step(SPEC, BASE, HW)
    assert all(v >= 0 for v in est.seconds_by_part.values())
    assert sum(est.seconds_by_part.values()) == pytest.approx(est.step_seconds, rel=1e-6)


def test_more_work_takes_longer():
    base = _seconds()
    assert _seconds(micro_batch=8) > base
    assert _seconds(seq_len=1024) > base
    assert _seconds(grad_accum=4) == pytest.approx(4 * base, rel=0.25)  # same micro-step, 4 of them
    assert _seconds(grad_checkpointing="full") > base  # the forward runs again


def test_lora_is_cheaper_than_full_training():
    lora = _seconds(method="lora", lora=LoraSettings(rank=8))
    assert lora < _seconds()


def test_big_vocabulary_tensors_fault_in_fresh_pages_every_step():
    # Allocations above the mmap threshold come back from the OS zeroed at every step.
    assert fresh_bytes(64 * 2**20, 1) == 64 * 2**20
    assert fresh_bytes(1 * 2**20, 1) == 0


def test_cpu_terms_are_all_costed():
    from trainfit.core.speed.flops import step_flops

    rates = cpu_rates(HW)
    sf = step_flops(SPEC, BASE)
    step = cpu_step(SPEC, BASE, rates, sf, "fp32", max(rates.peak_flops.values()))
    for name in ("gemm_seconds", "attention_seconds", "elementwise_seconds", "vocabulary_seconds",
                 "dispatch_seconds", "optimizer_seconds"):
        assert getattr(step, name) > 0, name
