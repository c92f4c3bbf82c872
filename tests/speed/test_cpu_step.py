"""Properties of the CPU step-time model that hold whatever its fitted constants.

The constants themselves are checked against timed steps in bench/step_time_accuracy.py.
"""

import dataclasses

import pytest

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.shapes import shape_from_dims
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


@pytest.fixture
def torch_basis(monkeypatch):
    from trainfit.core.speed import cpu as model

    monkeypatch.setattr(model, "CPU_FP32_GEMM_BASIS", "torch_training")


def test_the_default_basis_is_numpys_peak_until_a_quiet_run_shows_torchs_closer():
    base = cpu_rates(HW)
    measured = dataclasses.replace(base, training_gemm_flops=50e9, training_gemm_narrow_flops=40e9)
    assert _step(measured).gemm_seconds == pytest.approx(_step(base).gemm_seconds)


def _step(rates, precision: str = "fp32", setup=BASE, spec=SPEC):
    from trainfit.core.speed.flops import step_flops

    peak, used = rates.flops_for(precision)
    return cpu_step(spec, setup, rates, step_flops(spec, setup), used, peak)


def test_measured_torch_training_matmul_anchors_the_fp32_gemms(torch_basis):
    """Where torch's own training matmul was measured, the fp32 GEMMs run at that rate (carried to the
    model's shape), whatever numpy's peak: its share of numpy's peak depends on the CPU and BLAS."""
    from trainfit.core.speed import cpu as model

    base = cpu_rates(HW)
    assert base.training_gemm_flops is None
    anchored = dataclasses.replace(base, training_gemm_flops=100e9)
    # at the benchmark's own shape the GEMMs run exactly at the measured rate
    assert model.gemm_flops_per_second(anchored, "fp32", 1.0, model.CPU_TRAINING_GEMM_WIDTH,
                                       model.CPU_TRAINING_GEMM_TOKENS) == pytest.approx(100e9)
    # thinner shapes reach less of it, as they reach less of the peak
    assert model.gemm_flops_per_second(anchored, "fp32", 1.0, 128, 128) < 100e9
    one, two = _step(anchored), _step(dataclasses.replace(base, training_gemm_flops=200e9))
    assert two.gemm_seconds == pytest.approx(one.gemm_seconds / 2)
    # the numpy peak no longer moves the fp32 GEMMs; it still sets them without the measurement
    faster_numpy = dataclasses.replace(anchored, peak_flops={**anchored.peak_flops, "fp32": 10 * anchored.peak_flops["fp32"]})
    assert _step(faster_numpy).gemm_seconds == pytest.approx(one.gemm_seconds)
    assert _step(dataclasses.replace(base, peak_flops=faster_numpy.peak_flops)).gemm_seconds < _step(base).gemm_seconds


def test_measured_first_touch_cost_replaces_the_reference_vms():
    big_vocab = shape_from_dims(2, 128, 4, 256000)  # 256k x 256 tokens x 4 B = 250 MiB logits: fresh pages
    rates = cpu_rates(HW)
    ref = _step(rates, spec=big_vocab, setup=dataclasses.replace(BASE, micro_batch=1))
    measured = dataclasses.replace(rates, first_touch_seconds_per_byte=2 * 1.8e-6 / 4096)
    doubled = _step(measured, spec=big_vocab, setup=dataclasses.replace(BASE, micro_batch=1))
    assert ref.first_touch_seconds > 0
    assert doubled.first_touch_seconds == pytest.approx(2 * ref.first_touch_seconds)
    assert doubled.step_first_touch_seconds == pytest.approx(2 * ref.step_first_touch_seconds)


def test_attention_follows_the_measured_torch_matmul_too(torch_basis):
    base = cpu_rates(HW)
    one = _step(dataclasses.replace(base, training_gemm_flops=100e9))
    two = _step(dataclasses.replace(base, training_gemm_flops=200e9))
    assert two.attention_seconds == pytest.approx(one.attention_seconds / 2)


def test_the_narrow_measurement_sets_how_fast_thin_matrices_fall_off(torch_basis):
    from trainfit.core.speed import cpu as model

    base = dataclasses.replace(cpu_rates(HW), training_gemm_flops=100e9)
    assert model.measured_half_hidden(base) == model.CPU_GEMM_HALF_HIDDEN["fp32"]  # not measured
    steep = dataclasses.replace(base, training_gemm_narrow_flops=80e9)
    flat = dataclasses.replace(base, training_gemm_narrow_flops=99e9)
    # the curve passes through both measurements
    for rates, narrow in ((steep, 80e9), (flat, 99e9)):
        at = model.gemm_flops_per_second(rates, "fp32", 1.0, model.CPU_TRAINING_GEMM_NARROW_WIDTH,
                                         model.CPU_TRAINING_GEMM_TOKENS)
        assert at == pytest.approx(narrow)
    assert _step(steep).gemm_seconds > _step(flat).gemm_seconds
    # noise cannot produce a cliff or a rise: clamped
    assert model.measured_half_hidden(dataclasses.replace(base, training_gemm_narrow_flops=20e9)) == model.CPU_MAX_HALF_HIDDEN
    assert model.measured_half_hidden(dataclasses.replace(base, training_gemm_narrow_flops=120e9)) == 0.0
