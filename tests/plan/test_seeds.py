"""The seeds' scenarios (shared/seeds 000, 002, 003, 004 and the spec's CPU case) as plans on
fixture or catalog hardware: each gives the seed's decision or a better one, with its reasons."""

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.catalog import resolve_model
from trainfit.core.plan.planner import PlanRequest, plan


def _modes(req):
    return {m.mode: m for m in plan(req).modes}


def test_m2_dpo_qwen2_half_b(fixture_machine):
    """Seed 000: Qwen2-0.5B-Instruct DPO on a MacBook M2 16 GB: no 8-bit optimizer or 4-bit base (no
    bitsandbytes on MPS), and what fits the unified memory the OS shares."""
    hw = fixture_machine("macbook-m2-16gb")
    modes = _modes(PlanRequest(hardware=hw, method="dpo", model=resolve_model("Qwen/Qwen2-0.5B-Instruct"),
                               examples=500, epochs=3))
    assert all(m.fits for m in modes.values())
    for m in modes.values():
        s = m.setup
        assert s.device == "mps" and s.method == "dpo"
        assert s.optimizer == "adamw" and s.quant == "none"  # nothing that needs CUDA + bitsandbytes
        assert m.memory_used_bytes <= m.memory_budget_bytes
    # the 50 % budget of the unified memory: full-weight DPO (policy + reference) does not fit,
    # DPO with LoRA (reference = the base with adapters off) does, and the reason says so
    c = modes["conservative"]
    assert c.setup.lora is not None and c.setup.dpo_reference == "lora-base"
    assert any("DPO (full weights)" in r and "needs" in r for r in c.reasons)


def test_rtx3060_llama3_8b_qlora():
    """Seed 002: Llama-3-8B on an RTX 3060 12 GB is a QLoRA job; the plan says why LoRA is not."""
    hw = resolve_hardware("rtx-3060")
    m = _modes(PlanRequest(hardware=hw, method="lora", model=resolve_model("meta-llama/Meta-Llama-3-8B"),
                           seq_len=512, examples=5000, modes=("balanced",)))["balanced"]
    assert m.fits
    assert m.setup.method == "qlora" and m.setup.quant.startswith("nf4")
    assert m.setup.precision == "bf16"  # Ampere: bf16 compute for the 4-bit base
    assert any(r.startswith("QLoRA") and "LoRA" in r and "needs" in r for r in m.reasons)
    assert any("compute capability 8.6" in r for r in m.reasons)


def test_two_rtx4090_qwen2_vl_2b_full_shards():
    """Seed 003: Qwen2-VL-2B on 2x RTX 4090: a full fine-tune fits with ZeRO sharding (not a method
    switch), and the reason names the memory a replicated copy would need."""
    hw = resolve_hardware("2x rtx-4090")
    m = _modes(PlanRequest(hardware=hw, method="full", model=resolve_model("Qwen/Qwen2-VL-2B-Instruct"),
                           seq_len=1024, examples=10000, modes=("balanced",)))["balanced"]
    assert m.fits and m.setup.method == "full" and m.setup.num_gpus == 2
    assert m.setup.zero_stage >= 2
    assert any(r.startswith(f"ZeRO-{m.setup.zero_stage}") and "needs" in r for r in m.reasons)
    assert m.memory_used_bytes <= m.memory_budget_bytes


def test_four_a100_full_32b_keeps_the_method():
    """A ~30B full fine-tune on 4x A100-80GB: ZeRO-3 with offload as needed, never a method switch."""
    hw = resolve_hardware("4x a100-80gb")
    modes = _modes(PlanRequest(hardware=hw, method="full", model=resolve_model("Qwen/Qwen2.5-32B"), seq_len=1024,
                               examples=2000))
    for m in modes.values():
        assert m.fits and m.setup.method == "full", (m.mode, m.setup)
        assert m.setup.zero_stage == 3
        assert m.setup.optimizer == "adamw" or m.setup.offload == "none"  # DeepSpeed's CPU Adam when offloading
    assert any(m.setup.offload != "none" for m in modes.values())


def test_t4_qwen_half_b_full_fp16():
    """Seed 004: Qwen2.5-0.5B full fine-tune on a T4: fp16 with loss scaling (Turing has no bf16)."""
    hw = resolve_hardware("t4")
    modes = _modes(PlanRequest(hardware=hw, method="full", model=resolve_model("Qwen/Qwen2.5-0.5B"), seq_len=512,
                               examples=2000))
    for m in modes.values():
        assert m.fits and m.setup.method == "full"
        assert m.setup.precision == "fp16-mixed" and m.setup.attention != "flash"
        assert any("fp16 with loss scaling" in r for r in m.reasons)


def test_this_cpu_pretraining_gives_honest_hours(fixture_machine):
    """A 2-core CPU VM cannot pretrain the conservative 23M in 2 h: the plan says so with the
    hours and plans the largest size that does train in time."""
    hw = fixture_machine("cpu-only-vm")
    modes = _modes(PlanRequest(hardware=hw, method="pretrain", vocab_size=4096))
    c = modes["conservative"]
    assert c.fits and c.setup.device == "cpu" and c.setup.precision in ("fp32", "bf16-mixed")
    assert c.pretrain["params"] < 23_000_000 and c.run.hours <= 2.0
    assert any("23M" in w and " h " in w for w in c.warnings)
    assert c.pretrain["tokens"] == int(12 * c.pretrain["params"])
    for m in modes.values():
        assert m.setup.zero_stage == 0 and m.setup.quant == "none" and m.setup.attention != "flash"
        assert m.run.hours is not None and m.run.tokens >= m.pretrain["tokens"] * 0.99


def test_inference_capacity_falls_back_to_quantised_weights():
    """Inference: the largest batch x context per mode; 8-bit / 4-bit weights only when 16-bit does not fit."""
    modes = _modes(PlanRequest(hardware=resolve_hardware("rtx-4090"), method="inference",
                               model=resolve_model("Qwen/Qwen2.5-7B")))
    assert modes["conservative"].fits and modes["conservative"].setup.quant in ("int8", "nf4-dq")
    assert modes["extreme"].setup.quant == "none" and modes["extreme"].setup.seq_len == 4096
    for m in modes.values():
        assert m.memory_used_bytes <= m.memory_budget_bytes
