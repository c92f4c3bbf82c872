"""Each CPU-runnable method trains end to end through the real CLI with a falling loss."""

from __future__ import annotations

import json

import pytest

from trainfit.cli.main import main

from .conftest import make_config


def _losses(run_dir):
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in recs if "loss" in r]


@pytest.mark.parametrize("method,extra", [
    ("pretrain", {}),
    ("sft", {}),
    ("lora", {"training": {"lora": {"rank": 8, "alpha": 16, "dropout": 0.0,
                                    "target_modules": ["q_proj", "v_proj", "up_proj", "down_proj"]}},
              "schedule": {"lr": 1e-2}}),
    ("dpo", {"training": {"seq_len": 64, "dpo_reference": "separate"}}),
])
def test_method_trains_with_falling_loss(tmp_path, capsys, method, extra):
    cfg = make_config(tmp_path, method, **extra)
    run_dir = tmp_path / "run"
    assert main(["train", str(cfg), "--out", str(run_dir), "--quiet", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)  # stdout holds exactly one JSON document
    losses = _losses(run_dir)
    assert len(losses) == 12
    assert sum(losses[-3:]) / 3 < losses[0] * (0.97 if method != "dpo" else 0.9), losses
    assert summary["weights"].startswith("random")
    assert summary["global_step"] == 12
    if method == "lora":
        assert 0 < summary["params_trainable"] < summary["params_total"] / 2
        assert (run_dir / "final" / "adapter_config.json").is_file()
    else:
        assert summary["params_trainable"] == summary["params_total"]
    assert (run_dir / "config.yaml").is_file() and (run_dir / "summary.json").is_file()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rec = [r for r in steps if "loss" in r and "event" not in r][-1]  # machine samples are interleaved
    for key in ("step", "loss", "learning_rate", "tokens_per_second", "samples_per_second", "peak_rss_bytes",
                "elapsed_seconds", "time"):
        assert key in rec
    assert rec["tokens_per_second"] > 0


def test_lora_base_reference_for_dpo(tmp_path):
    from trainfit.config.run_config import load_run_config
    from trainfit.train.runner import run_training

    cfg = load_run_config(make_config(tmp_path, "dpo", training={
        "dpo_reference": "lora-base", "lora": {"rank": 4, "alpha": 8, "dropout": 0.0,
                                               "target_modules": ["q_proj", "v_proj"]}},
        schedule={"max_steps": 4, "lr": 1e-2}))
    result = run_training(cfg, tmp_path / "run", quiet=True)
    assert result.global_step == 4
    assert result.losses[0][1] == pytest.approx(0.6931, abs=1e-3)  # policy == reference at step 1


def test_qlora_on_cpu_is_unavailable(tmp_path, capsys):
    cfg = make_config(tmp_path, "lora")
    text = cfg.read_text().replace("method: lora", "method: qlora")
    cfg.write_text(text)
    assert main(["train", str(cfg), "--out", str(tmp_path / "run"), "--quiet"]) == 4
    err = capsys.readouterr().err
    assert "qlora needs a CUDA GPU" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("example", ["pretrain", "sft-full", "lora", "dpo"])
def test_cpu_examples_run_two_steps(tmp_path, example):
    from .conftest import REPO

    run_dir = tmp_path / "run"
    assert main(["train", str(REPO / "examples" / f"{example}.yaml"), "--out", str(run_dir), "--max-steps", "2",
                 "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == 2 and (run_dir / "checkpoints" / "checkpoint-2").is_dir()
