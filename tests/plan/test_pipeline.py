"""`trainfit plan --pipeline`: seed 000's SFT -> DPO path (Qwen2-0.5B-Instruct on a MacBook M2 16 GB,
Qwen2.5-7B-Instruct on one A100-40GB, Qwen2.5-14B / 32B-Instruct on 4 / 8 GPUs; 500 / 10k / 40k
preference pairs, 3 epochs) planned per phase, written as one meta-config per mode, loaded back."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from trainfit.cli.main import main
from trainfit.config.pipeline import load_pipeline
from trainfit.core.machines.hardware_spec import resolve_hardware
from trainfit.core.models.catalog import resolve_model
from trainfit.core.plan.pipeline import PipelineRequest, plan_pipeline
from trainfit.core.plan.planner import PlanRequest

# (hardware, model, pairs, DPO on a 4-bit base): 14B on one 40 GB GPU fits DPO only on a 4-bit base
# in some mode (the planner's DPO + QLoRA: method dpo with training.lora and quant); on 4 or 8 GPUs
# ZeRO-3 partitions the full-weight DPO's reference with the policy (TRL's prepare_deepspeed), so
# 14B on 4x 40 GB and 32B on 8x 80 GB train all their weights.
SEED_000 = [
    ("m2-16gb", "Qwen/Qwen2-0.5B-Instruct", "500", False),
    ("a100-40gb", "Qwen/Qwen2.5-7B-Instruct", "10000", False),
    ("a100-40gb", "Qwen/Qwen2.5-14B-Instruct", "40000", True),
    ("4x a100-40gb", "Qwen/Qwen2.5-14B-Instruct", "40000", False),
    ("4x h100-sxm", "Qwen/Qwen2.5-14B-Instruct", "40000", False),
    ("8x h100-sxm", "Qwen/Qwen2.5-32B-Instruct", "40000", False),
]
FIGURES = ("hours", "energy_kwh", "electricity_cost", "tokens", "steps")


@pytest.mark.parametrize("hardware,model,pairs,quantized_dpo", SEED_000)
def test_seed_000_pipeline_meta_config(tmp_path, capsys, hardware, model, pairs, quantized_dpo):
    out = tmp_path / "plans"
    code = main(["plan", model, "--pipeline", "sft+dpo", "--hardware", hardware, "--pairs", pairs, "--epochs", "3",
                 "--out", str(out), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["pipeline"] == "sft+dpo" and [m["mode"] for m in doc["modes"]] == ["conservative", "balanced", "extreme"]
    assert code == 0
    assert any(m["phases"][1]["plan"]["setup"]["quant"] != "none" for m in doc["modes"]) == quantized_dpo
    for mode in doc["modes"]:
        assert mode["fits"], mode["warnings"]
        sft, dpo = mode["phases"]
        # each phase fits its mode's memory budget, with its own method
        for ph in (sft, dpo):
            plan = ph["plan"]
            assert plan["fits"] and plan["memory_used_bytes"] <= plan["memory_budget_bytes"]
        assert sft["plan"]["setup"]["method"] in ("full", "lora", "qlora") and dpo["plan"]["setup"]["method"] == "dpo"
        # totals = the sum of the phases
        for key in FIGURES:
            assert mode["totals"][key] == pytest.approx(sum(ph["plan"]["run"][key] for ph in (sft, dpo)))
        # the hand-off
        sft_lora = sft["plan"]["setup"]["lora"] is not None
        assert dpo["start_from"] == "sft" and dpo["adapters"] == ("merge" if sft_lora else None)
        assert mode["hours_max"] > 0 and mode["totals"]["hours"] <= mode["hours_max"] * 1.0001

        # the meta-config, loaded back: both phases complete run configs, the hand-off, the estimate
        meta = out / mode["mode"] / "pipeline.yaml"
        assert str(meta) in mode["files"]
        text = meta.read_text()
        assert text.startswith("# trainfit ") and "\n# reproduce: trainfit plan " in text
        p = load_pipeline(meta)
        assert [ph.name for ph in p.phases] == ["sft", "dpo"] and p.version == 1
        a, b = p.phases
        assert a.start_from is None and b.start_from == "sft" and b.adapters == "merge"
        if dpo["plan"]["setup"]["quant"] != "none":  # LoRA on the 4-bit base, the base as its reference
            assert b.config.training.quant == dpo["plan"]["setup"]["quant"] and b.config.training.lora
            assert b.config.training.dpo_reference == "lora-base"
        assert a.config.method == sft["plan"]["setup"]["method"] and b.config.method == "dpo"
        assert a.config.schedule.max_steps == sft["plan"]["run"]["steps"]
        assert b.config.schedule.max_steps == dpo["plan"]["run"]["steps"]
        assert b.config.training.micro_batch == dpo["plan"]["setup"]["micro_batch"]
        assert a.config.data.paths == ["builtin:tiny-chat"] and b.config.data.paths == ["builtin:tiny-preferences"]
        raw = yaml.safe_load(text)
        assert ("adapters" in raw["phases"][1]) == sft_lora
        est = raw["estimate"]
        for key in FIGURES:
            assert est["totals"][key] == pytest.approx(sum(est["phases"][n][key] for n in ("sft", "dpo")))
        # each phase's own files, in its folder
        for name in ("sft", "dpo"):
            run_yaml = out / mode["mode"] / name / "run.yaml"
            assert run_yaml.is_file() and "phase " + name + " of a pipeline" in run_yaml.read_text()


def _pipeline(hardware: str, model: str | None, pipeline: str = "sft+dpo", **kw):
    base = PlanRequest(hardware=resolve_hardware(hardware), model=resolve_model(model) if model else None,
                       epochs=kw.pop("epochs", 3.0), time_budget_hours=kw.pop("time_budget_hours", None))
    return plan_pipeline(PipelineRequest(pipeline, base, **kw))


def test_dpo_reference_is_held_as_planned():
    """DPO with LoRA: the base with the adapter off, no copy in the estimate. Full-weight DPO: a frozen
    copy of the starting model, counted in the memory the phase is fitted with."""
    lora_dpo = _pipeline("m2-16gb", "Qwen/Qwen2-0.5B-Instruct", pairs=500)
    for mode in lora_dpo.modes:
        dpo = mode.phases[1]
        assert dpo.plan.setup.dpo_reference == "lora-base" and dpo.reference_bytes == 0
        assert "no extra copy" in dpo.reference
        assert not [c for d in dpo.plan.memory.devices for c in d.components if c.name == "reference_model"]
    full_dpo = _pipeline("a100-80gb", "Qwen/Qwen2-0.5B-Instruct", pairs=2000, sft_method="full")
    extreme = {m.mode: m for m in full_dpo.modes}["extreme"]
    dpo = extreme.phases[1]
    s = dpo.plan.setup
    assert s.method == "dpo" and s.lora is None and s.dpo_reference == "separate"
    per_param = 4 if s.precision in ("fp32", "bf16-mixed", "fp16-mixed") else 2
    assert dpo.reference_bytes == pytest.approx(dpo.plan.params_total * per_param, rel=0.01)
    assert dpo.reference_bytes < dpo.plan.memory_used_bytes <= dpo.plan.memory_budget_bytes
    assert "frozen copy" in dpo.reference
    assert extreme.phases[1].adapters is None  # full SFT: final/ is loaded as saved


def test_time_budget_caps_every_phase_alike():
    pp = _pipeline("a100-40gb", "Qwen/Qwen2.5-7B-Instruct", pairs=10000)
    cons = {m.mode: m for m in pp.modes}["conservative"]
    assert cons.capped_share is not None and 0 < cons.capped_share < 1
    assert cons.totals.hours <= cons.hours_max * 1.0001
    for ph in cons.phases:
        assert ph.uncapped is not None
        assert ph.plan.run.steps == max(1, math.floor(ph.uncapped.steps * cons.capped_share))
        assert ph.plan.run.hours < ph.uncapped.hours
    assert any("time budget" in w and f"{cons.capped_share:.0%}" in w for w in cons.warnings)
    # a generous budget caps nothing
    loose = _pipeline("a100-40gb", "Qwen/Qwen2.5-7B-Instruct", pairs=10000, time_budget_hours=1000.0)
    assert all(m.capped_share is None and all(ph.uncapped is None for ph in m.phases) for m in loose.modes)


def test_sizes_default_to_each_other():
    pp = _pipeline("a100-40gb", "Qwen/Qwen2.5-7B-Instruct", pairs=2000, time_budget_hours=1000.0)
    sft, dpo = pp.modes[0].phases
    assert sft.request.examples == 2000 and dpo.request.examples == 2000
    assert any("chosen answers" in n for n in pp.notes)
    pp = _pipeline("a100-40gb", "Qwen/Qwen2.5-7B-Instruct", examples=5000, pairs=1000, time_budget_hours=1000.0)
    sft, dpo = pp.modes[0].phases
    assert (sft.request.examples, dpo.request.examples) == (5000, 1000)
    # DPO steps from pairs x epochs / global batch; tokens count two sequences per pair at the pairs'
    # lengths (unpacked, each sequence is padded to seq_len: the padded slots are an upper bound)
    s = dpo.plan.setup
    sized = dpo.plan.data_lengths
    assert sized.rows == 1000 and dpo.plan.run.tokens == int(sized.epoch_tokens * dpo.request.epochs)
    assert dpo.plan.run.tokens < dpo.plan.run.steps * s.global_batch * s.seq_len * 2


def test_pretrain_then_sft_on_the_planned_shape():
    pp = _pipeline("rtx-4090", None, "pretrain+sft+dpo", examples=2000, epochs=1.0)
    for mode in pp.modes:
        pre, sft, dpo = mode.phases
        assert pre.plan.setup.method == "pretrain" and pre.plan.pretrain is not None
        assert pre.plan.run.tokens >= 0.99 * pre.plan.pretrain["tokens"] * (mode.capped_share or 1)
        assert sft.plan.model_id == pre.plan.model_id == dpo.plan.model_id  # the shape pretraining chose
        assert (sft.start_from, dpo.start_from) == ("pretrain", "sft")
        for key in ("hours", "energy_kwh"):
            assert getattr(mode.totals, key) == pytest.approx(sum(getattr(p.plan.run, key) for p in mode.phases))


@pytest.mark.parametrize("argv,message", [
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "dpo+sft"], "--pipeline: 'dpo+sft' is not one of"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "pretrain+sft"], "pretraining starts from random weights"),
    (["--pipeline", "sft+dpo"], "MODEL missing"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--method", "dpo"], "not a method for the SFT phase"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--data", "rl=x.jsonl"], "--data PHASE=PATH"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--data", "sft=/no/such.jsonl"], "does not exist"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--pairs", "0"], "--pairs"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pairs", "500"], "counts the DPO phase of a --pipeline"),
    (["Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--dataset-tokens", "1m"], "sizes a pretraining phase"),
    (["--pipeline", "pretrain+sft", "--pairs", "10"], "has no DPO phase"),
])
def test_bad_pipeline_input_exits_2(tmp_path, capsys, argv, message):
    try:
        code = main(["plan", *argv, "--hardware", "a100-40gb", "--out", str(tmp_path / "o")])
    except SystemExit as exc:  # a flag's own type check (argparse) exits from the parser
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_existing_files_are_not_overwritten(tmp_path, capsys):
    argv = ["plan", "Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--hardware", "m2-16gb", "--pairs", "500",
            "--mode", "balanced", "--out", str(tmp_path)]
    assert main(argv) == 0
    meta = tmp_path / "balanced" / "pipeline.yaml"
    meta.write_text("# mine\n")
    assert main(argv) == 2
    assert "exist" in capsys.readouterr().err and meta.read_text() == "# mine\n"
    assert main([*argv, "--force"]) == 0 and meta.read_text().startswith("# trainfit ")


def test_data_per_phase(tmp_path, capsys):
    chat, pairs = tmp_path / "chat.jsonl", tmp_path / "pairs.jsonl"
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n')
    pairs.write_text('{"prompt": "hi", "chosen": "hello", "rejected": "go away"}\n')
    out = tmp_path / "plans"
    argv = ["plan", "Qwen/Qwen2-0.5B-Instruct", "--pipeline", "sft+dpo", "--hardware", "a100-40gb", "--pairs", "1000",
            "--mode", "balanced", "--data", f"sft={chat}", "--data", f"dpo={pairs}", "--out", str(out)]
    assert main(argv) == 0
    p = load_pipeline(out / "balanced" / "pipeline.yaml")
    assert [ph.config.data.paths for ph in p.phases] == [[str(chat)], [str(pairs)]]
    assert "shipped sample set" not in (out / "balanced" / "pipeline.yaml").read_text()


def test_cost_budget_caps_the_whole_pipeline():
    base = PlanRequest(hardware=resolve_hardware("a100-40gb"), model=resolve_model("Qwen/Qwen2.5-7B-Instruct"),
                       epochs=3.0, time_budget_hours=1000.0, usd_per_hour=2.0, budget_usd=5.0, modes=("balanced",))
    mode = plan_pipeline(PipelineRequest("sft+dpo", base, pairs=10000)).modes[0]
    uncapped = sum(ph.uncapped.rental_usd for ph in mode.phases)
    assert mode.capped_share == pytest.approx(5.0 / uncapped)
    assert mode.totals.rental_usd <= 5.0 and any("cost budget" in w for w in mode.warnings)
