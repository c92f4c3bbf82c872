"""Hardware rules as data: what each device family can run, and the reason a plan quotes."""

import pytest

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.plan.hardware_rules import rules_for, unsupported
from trainfit.core.setup import TrainingSetup


@pytest.mark.parametrize("spec, half, flash, quant", [
    ("rtx-4090", "bf16", True, True),  # Ada: bf16, FA2, bitsandbytes
    ("rtx-3060", "bf16", True, True),  # Ampere
    ("t4", "fp16", False, True),  # Turing: fp16 + loss scaling, no FA2
    ("v100-32gb", "fp16", False, True),  # Volta
    ("m2-16gb", "bf16", False, False),  # Apple: no bitsandbytes
    ("m1-16gb", "fp16", False, False),  # M1: no bf16 in Metal
    ("cpu", None, False, False),  # generic x86 without AVX512-BF16
])
def test_family_rules(spec, half, flash, quant):
    r = rules_for(resolve_hardware(spec))
    assert r.half == half
    assert ("flash" in r.attention) is flash
    assert r.quantization is quant
    assert r.reasons["precision"]


def test_pascal_trains_in_fp32():
    r = rules_for(resolve_hardware("gtx-1080-ti"))
    assert r.half is None and "no tensor cores" in r.reasons["precision"]


def test_sharding_needs_several_gpus_and_names_the_link():
    one, two, eight = (rules_for(resolve_hardware(s)) for s in ("rtx-4090", "2x rtx-4090", "8xh100-sxm"))
    assert one.max_zero_stage == 0 and two.max_zero_stage == 3
    assert "PCIe" in two.reasons["sharding"] and "NVLink" in eight.reasons["sharding"]


def test_unsupported_explains_why():
    cpu = rules_for(resolve_hardware("cpu"))
    assert "bitsandbytes" in unsupported(cpu, TrainingSetup(device="cpu", precision="fp32", optimizer="adamw-8bit"))
    assert "flash" in unsupported(cpu, TrainingSetup(device="cpu", precision="fp32", attention="flash"))
    assert "fp16" in unsupported(cpu, TrainingSetup(device="cpu", precision="fp16-mixed"))
    assert unsupported(cpu, TrainingSetup(device="cpu", precision="fp32")) is None
    t4 = rules_for(resolve_hardware("t4"))
    assert "bf16" in unsupported(t4, TrainingSetup(precision="bf16-mixed"))
