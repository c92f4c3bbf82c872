"""torch.compile as a knob of the speed model: Inductor fuses each elementwise chain into one kernel,
so the memory-bound share of a step and its kernel launches shrink; the matmuls and the memory
estimate stay as they are."""

import dataclasses

from trainfit.core.machines.gpu_catalog import get_gpu
from trainfit.core.memory import estimate_memory
from trainfit.core.setup import LoraSettings, TrainingSetup
from trainfit.core.speed import flops as F
from trainfit.core.speed import gpu_spec_rates, predict_step

from .conftest import LLAMA3_8B

H100 = gpu_spec_rates(get_gpu("h100-sxm"))
EAGER = TrainingSetup(method="lora", precision="bf16", micro_batch=2, seq_len=2048, grad_checkpointing="full",
                      attention="flash", device="cuda", lora=LoraSettings())


def test_compile_fuses_the_elementwise_chains():
    eager = F.elementwise_elements_per_token_layer(LLAMA3_8B)
    fused = F.elementwise_elements_per_token_layer(LLAMA3_8B, compiled=True)
    assert fused < 0.5 * eager  # norms 12h -> 2h, rotary 6 -> 2, SiLU x up 6 -> 3 per element


def test_compiled_step_is_faster_with_the_same_matmuls_and_layer_memory():
    compiled = dataclasses.replace(EAGER, torch_compile=True)
    a, b = predict_step(LLAMA3_8B, EAGER, H100), predict_step(LLAMA3_8B, compiled, H100)
    assert b.step_seconds < a.step_seconds < 1.5 * b.step_seconds
    assert b.step_flops == a.step_flops
    assert b.seconds_by_part["memory bandwidth"] < a.seconds_by_part["memory bandwidth"]
    assert b.seconds_by_part["framework overhead"] < a.seconds_by_part["framework overhead"]
    # Memory: the layers are counted as eager; the loss keeps the 16-bit logits, not an fp32 log_softmax
    # (tests/memory/test_compiled_loss.py).
    parts = [{c.name: c.bytes for c in estimate_memory(LLAMA3_8B, s).devices[0].components if c.in_tensor_peak}
             for s in (EAGER, compiled)]
    assert {k: v for k, v in parts[1].items() if k != "logits"} == {k: v for k, v in parts[0].items() if k != "logits"}
    assert parts[1]["logits"] < parts[0]["logits"]


def test_a_cpu_step_fuses_the_same_chains():
    """Inductor's CPU backend fuses the same chains: the CPU model's elementwise traffic shrinks too."""
    from trainfit.core.speed.rates import device_rates
    from trainfit.core.machines.hardware_spec import resolve_hardware

    cpu = device_rates(resolve_hardware("cpu"), "cpu")
    setup = TrainingSetup(method="full", precision="fp32", micro_batch=1, seq_len=256, device="cpu")
    spec = LLAMA3_8B
    a = predict_step(spec, setup, cpu)
    b = predict_step(spec, dataclasses.replace(setup, torch_compile=True), cpu)
    assert b.seconds_by_part["memory bandwidth"] < a.seconds_by_part["memory bandwidth"]
