"""`trainfit train META.yaml`: the CPU-sized SFT -> DPO pipeline for real (a tiny random model on
the shipped tiny-chat and tiny-preferences sets), the hand-off between the phases, and resume
across the phase boundary with the same losses as an uninterrupted pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainfit.cli.main import main
from trainfit.config.pipeline import load_pipeline
from trainfit.train import pipeline_run
from trainfit.train.pipeline_run import run_pipeline

from .conftest import BASE, loss_trajectory, tree_digest

SFT_LORA = {"rank": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "up_proj", "down_proj"]}
DPO_LORA = {"rank": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]}


def _run(method: str, data: dict, steps: int, **training) -> dict:
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    cfg.update(method=method, data=data, monitoring={"enabled": False})
    cfg["training"].update(training)
    cfg["schedule"].update(max_steps=steps, lr=1e-2, warmup_steps=1)
    cfg["checkpointing"] = {"every_steps": 2, "keep_last": 2}
    return cfg


def write_meta(tmp: Path, *, lora: bool, name: str = "meta.yaml", sft_steps: int = 4, dpo_steps: int = 6) -> Path:
    """A two-phase meta-config: SFT (LoRA or full) -> DPO (LoRA with the base as reference, or full
    weights with a frozen copy)."""
    sft = _run("lora" if lora else "sft", {"paths": ["builtin:tiny-chat"], "format": "chat"}, sft_steps,
               **({"lora": SFT_LORA} if lora else {}))
    dpo = _run("dpo", {"paths": ["builtin:tiny-preferences"]}, dpo_steps,
               **({"lora": DPO_LORA, "dpo_reference": "lora-base"} if lora else {"dpo_reference": "separate"}))
    meta = {"version": 1, "pipeline": "sft+dpo", "name": "tiny", "phases": [
        {"name": "sft", "run": sft}, {"name": "dpo", "start_from": "sft", "adapters": "merge", "run": dpo}]}
    path = tmp / name
    path.write_text(yaml.safe_dump(meta, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def lora_pipeline(tmp_path_factory):
    """The uninterrupted LoRA SFT -> DPO pipeline (the reference trajectory)."""
    tmp = tmp_path_factory.mktemp("lora_pipeline")
    meta = write_meta(tmp, lora=True)
    doc = run_pipeline(load_pipeline(meta), tmp / "out", quiet=True)
    return meta, tmp / "out", doc


def test_both_phases_run_and_phase_b_trains_the_merged_model(lora_pipeline):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trainfit.train.model_build import build_model
    from trainfit.train.tokenizer import load_tokenizer

    meta, out, doc = lora_pipeline
    assert doc["finished"] and [p["status"] for p in doc["phases"]] == ["done", "done"]
    assert [p["summary"]["global_step"] for p in doc["phases"]] == [4, 6]
    assert json.loads((out / "summary.json").read_text()) == doc
    state = json.loads((out / "pipeline_state.json").read_text())
    assert state["finished"] and state["phases"][1]["start_model"] == "sft/merged"
    # phase B loads phase A's merged model (weights and tokenizer), nothing else
    merged = out / "sft" / "merged"
    b_cfg = yaml.safe_load((out / "dpo" / "config.yaml").read_text())
    assert b_cfg["model"] == {"id": None, "path": str(merged), "shape": None, "weights": "local"}
    assert doc["phases"][1]["summary"]["weights"] == f"local: {merged}"
    assert (merged / "tokenizer.json").is_file() and not (merged / "adapter_config.json").exists()
    # the merged weights are phase A's base + its trained adapter: same logits as the PEFT model
    sft_cfg = load_pipeline(meta).phases[0].config
    tok = load_tokenizer(out / "sft" / "final")
    base = build_model(sft_cfg, tok).model
    ids = torch.tensor([[5, 17, 42, 99, 3, 250]])
    with torch.no_grad():
        base_logits = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, str(out / "sft" / "final")).eval()(ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(str(merged)).eval()(ids).logits
    assert torch.allclose(merged_logits, peft_logits, atol=1e-5)
    assert not torch.allclose(merged_logits, base_logits, atol=1e-4)  # the adapter trained: a real hand-off
    # DPO's reference is its starting model: policy == reference at step 1, loss ln 2
    assert loss_trajectory(out / "dpo")[1] == pytest.approx(0.6931, abs=1e-3)


@pytest.mark.slow
def test_resume_across_the_phase_boundary_gives_the_same_losses(lora_pipeline, tmp_path, monkeypatch):
    meta, ref_out, _ = lora_pipeline
    p = load_pipeline(meta)
    out = tmp_path / "out"
    # 1. stopped inside phase A
    doc = run_pipeline(p, out, stop_after=2, quiet=True)
    assert doc["stopped_in"] == "sft" and doc["phases"][0]["global_step"] == 2
    assert doc["phases"][1]["status"] == "pending" and not (out / "dpo").exists()
    # 2. phase A finishes, then the process dies during the hand-off (the merge)
    def crash(*args, **kwargs):
        raise KeyboardInterrupt("killed during the merge")
    monkeypatch.setattr(pipeline_run, "merge_adapter", crash)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(p, out, resume=True, quiet=True)
    state = json.loads((out / "pipeline_state.json").read_text())
    assert [s["status"] for s in state["phases"]] == ["done", "pending"]
    assert not (out / "sft" / "merged").exists()  # atomic: no half-merged model under its name
    assert not [q.name for q in (out / "sft").iterdir() if q.name.startswith(".merged")]
    monkeypatch.undo()
    sft_before = tree_digest(out / "sft")
    # 3. resumed: the hand-off is made, phase B stops at its step 5 (of 6)
    doc = run_pipeline(p, out, resume=True, stop_after=5, quiet=True)
    assert doc["stopped_in"] == "dpo" and doc["phases"][1]["global_step"] == 5
    after_handoff = tree_digest(out / "sft")
    assert {k: v for k, v in after_handoff.items() if not k.startswith("merged/")} == sft_before  # A not re-run
    # 4. resumed again: phase B continues from its checkpoint, phase A and the hand-off are left alone
    logs: list[str] = []
    doc = run_pipeline(p, out, resume=True, quiet=True, log=logs.append)
    assert doc["finished"] and doc["phases"][1]["summary"]["resumed_from"] == "checkpoint-5"
    assert any("phase sft: finished earlier" in line for line in logs)
    assert not any("hand-off: merging" in line for line in logs)
    assert tree_digest(out / "sft") == after_handoff
    for phase in ("sft", "dpo"):
        assert loss_trajectory(out / phase) == loss_trajectory(ref_out / phase), phase
    # a finished pipeline resumes to nothing
    assert run_pipeline(p, out, resume=True, quiet=True)["finished"]


def test_full_sft_then_full_dpo_through_the_cli(tmp_path, capsys):
    """Full weights in both phases: phase B loads phase A's final/ as saved, with a frozen copy as the
    DPO reference; `trainfit train META.yaml --json` prints one summary covering both phases."""
    meta = write_meta(tmp_path, lora=False, sft_steps=3, dpo_steps=3)
    out = tmp_path / "run"
    assert main(["train", str(meta), "--out", str(out), "--quiet", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["pipeline"] == "sft+dpo" and doc["finished"]
    phases = [(p["name"], p["method"], p["global_step"]) for p in doc["phases"]]
    assert phases == [("sft", "full", 3), ("dpo", "dpo", 3)]
    assert doc["phases"][1]["start_model"] == "sft/final" and not (out / "sft" / "merged").exists()
    assert doc["phases"][1]["summary"]["weights"] == f"local: {out.resolve() / 'sft' / 'final'}"
    assert doc["totals"]["optimizer_steps"] == 6
    assert loss_trajectory(out / "dpo")[1] == pytest.approx(0.6931, abs=1e-3)
    # the same --out again without --resume is refused, nothing touched
    before = tree_digest(out)
    assert main(["train", str(meta), "--out", str(out), "--quiet"]) == 2
    assert "already holds a pipeline" in capsys.readouterr().err
    assert tree_digest(out) == before
    # a changed meta-config does not resume another pipeline's directory
    changed = tmp_path / "changed.yaml"
    changed.write_text(meta.read_text().replace("lr: 0.01", "lr: 0.02"))
    assert main(["train", str(changed), "--out", str(out), "--resume", "--quiet"]) == 2
    assert "different pipeline config" in capsys.readouterr().err
    assert tree_digest(out) == before


@pytest.mark.parametrize("edit,message", [
    (lambda m: m["phases"][1].update(adapters="stack"), "adapters: 'stack' is not supported"),
    (lambda m: m["phases"][1].update(start_from="pretrain"), "start_from: 'pretrain' is not an earlier phase"),
    (lambda m: m["phases"][1].update(name="sft"), "is used by an earlier phase"),
    (lambda m: m["phases"][0]["run"].update(method="dpo"), "dpo needs 'preference' data"),
    (lambda m: m.update(version=2), "version: 2 is not supported"),
    (lambda m: m.update(phase=[]), "did you mean phases"),
])
def test_bad_meta_configs_are_refused_before_training(tmp_path, capsys, edit, message):
    meta = write_meta(tmp_path, lora=True)
    raw = yaml.safe_load(meta.read_text())
    edit(raw)
    meta.write_text(yaml.safe_dump(raw))
    assert main(["train", str(meta), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_verify_is_for_one_run_config(tmp_path, capsys):
    meta = write_meta(tmp_path, lora=True)
    assert main(["train", str(meta), "--out", str(tmp_path / "run"), "--verify", "--quiet"]) == 2
    assert "--verify" in capsys.readouterr().err and not (tmp_path / "run").exists()
