"""The search engine and its policies: tiers in order, chains cut at the first misfit, lazy
chains bound to their own base, and nearest keeping the user's method."""

import dataclasses

from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.catalog import resolve_model
from trainfit.core.plan import space
from trainfit.core.plan.engine import Budget, Tier, by_step_time, search
from trainfit.core.plan.nearest import nearest_fitting
from trainfit.core.setup import TrainingSetup


def test_batch_chains_keep_their_own_base():
    bases = space.product(TrainingSetup(num_gpus=2, device="cuda"), grad_checkpointing=("none", "full"),
                          zero_stage=(0, 2))
    chains = [list(c) for c in space.batch_chains(bases, [1, 2, 4], 16)]
    assert [c[0].grad_checkpointing for c in chains] == [b.grad_checkpointing for b in bases]
    assert [c[0].zero_stage for c in chains] == [b.zero_stage for b in bases]
    assert all(s.global_batch == 16 for c in chains for s in c)


def test_first_tier_with_a_fit_wins_and_chains_stop_at_the_first_misfit():
    model, hw = resolve_model("qwen2.5-0.5b"), resolve_hardware("t4")
    calls = []

    def memory(m, s, h):
        from trainfit.core.memory import estimate_memory

        calls.append(s)
        return estimate_memory(m, s, h)

    huge = TrainingSetup(precision="fp16-mixed", seq_len=8192)
    small = dataclasses.replace(huge, seq_len=256)
    tiers = [Tier("long", space.batch_chains([huge], [1, 2, 4, 8], 8)),
             Tier("short", space.batch_chains([small], [1, 2, 4, 8], 8))]
    result = search(model, hw, tiers, rank_key=by_step_time, budget=Budget(share=1.0), memory_fn=memory)
    assert result.tier == "short" and "long" in result.rejected
    assert [s.seq_len for s in calls].count(8192) == 1  # the long chain ended at its first misfit
    assert result.best.need_ratio <= 1.0


def test_nearest_keeps_full_fine_tuning_on_four_a100():
    model, hw = resolve_model("qwen2.5-32b"), resolve_hardware("4x a100-80gb")
    asked = TrainingSetup(method="full", num_gpus=4, seq_len=512)
    found = nearest_fitting(model, asked, hw)
    assert found is not None and found.method == "full" and found.zero_stage == 3
    # with ZeRO-3 + offload given, it does not suggest going back to ZeRO-2 without offload
    given = dataclasses.replace(asked, zero_stage=3, offload="optimizer", grad_checkpointing="full")
    again = nearest_fitting(model, given, hw)
    assert again is not None and again.zero_stage == 3 and again.offload != "none"


def test_nothing_bitsandbytes_on_apple():
    model, hw = resolve_model("qwen2-0.5b-instruct"), resolve_hardware("m2-16gb")
    found = nearest_fitting(model, TrainingSetup(method="dpo", device="mps", precision="bf16-mixed", micro_batch=8,
                                                 seq_len=2048), hw)
    assert found is not None and found.optimizer == "adamw" and found.quant == "none"


def test_searches_compare_what_the_run_needs_and_the_plan_warns_when_that_is_only_under_pressure():
    from trainfit.core.memory import estimate_memory
    from trainfit.core.plan.engine import need_ratio
    from trainfit.core.plan.planner import PlanRequest, plan

    # Llama 3.2 1B full fine-tune on a 24 GB card, extreme (95 %): the chosen setting needs about
    # 92 % of the 23.64 GiB PyTorch can allocate, and with room to spare the allocator would
    # reserve about 101 %
    hw = resolve_hardware("1x rtx-4090")
    spec = resolve_model("meta-llama/Llama-3.2-1B")
    mode = plan(PlanRequest(hw, method="full", model=spec, examples=1000, modes=("extreme",))).modes[0]
    dev = mode.memory.devices[0]
    assert dev.fits_under_pressure and dev.needed_bytes <= 0.95 * dev.capacity_bytes < dev.total_bytes
    assert any("frees its cache and retries" in w for w in mode.warnings)
    # the engine's ratio is the verdict's: estimate and every search agree on "fits"
    est = estimate_memory(spec, mode.setup, hw)
    assert need_ratio(est, Budget()) == est.devices[0].needed_bytes / est.devices[0].capacity_bytes
    assert est.fits is True and need_ratio(est, Budget()) <= 1.0


def test_a_moe_qlora_plan_says_why_quantisation_saves_little():
    """transformers >= 5 fuses Mixtral's experts into 3-D parameters, which bitsandbytes leaves 16-bit:
    the plan says so where QLoRA is on the table (a CUDA card), and not where it is not (a CPU) or
    for a dense model."""
    from trainfit.core.plan.planner import PlanRequest, plan

    mixtral = resolve_model("mistralai/Mixtral-8x7B-v0.1")
    gpu = plan(PlanRequest(resolve_hardware("1x a100-80gb"), method="qlora", model=mixtral, examples=100,
                           modes=("balanced",))).modes[0]
    assert any("bitsandbytes#1849" in w and "45.1B expert parameters" in w for w in gpu.warnings)
    dense = plan(PlanRequest(resolve_hardware("1x a100-80gb"), method="qlora", model=resolve_model("qwen2.5-0.5b"),
                             examples=100, modes=("balanced",))).modes[0]
    assert not any("bitsandbytes#1849" in w for w in dense.warnings)
