"""NaN gradients with a finite loss, and non-finite losses in the record, through `trainfit train`
on CPU (TRAINFIT_FAULTS=nangrad@N: the loss of step N is finite, its gradients NaN).

Before: the update went through, the next NaN loss checkpointed that poisoned state as the "last
good" one, and the fp32 fallback died pointing at it. Now the gradient norm is checked before
every update, and no checkpoint is written unless every trained parameter is finite."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from trainfit.cli.main import main
from trainfit.train.recovery import faults

from .conftest import make_config

STEPS = 12


def checkpoint_tensors(run_dir: Path) -> dict[str, list[Path]]:
    """Every weights / optimizer file of every complete checkpoint, and of final/."""
    out = {}
    for ckpt in sorted((run_dir / "checkpoints").glob("checkpoint-*")):
        manifest = json.loads((ckpt / "trainfit-manifest.json").read_text())
        assert manifest["parameters_finite"] is True  # the label says so ...
        out[ckpt.name] = sorted(ckpt.glob("*.safetensors")) + [ckpt / "optimizer.pt"]
    out["final"] = sorted((run_dir / "final").glob("*.safetensors"))
    return out


def all_finite(files: list[Path]) -> bool:
    """... and the tensors agree (weights, and the optimizer's moments)."""
    for f in files:
        tensors = load_file(str(f)) if f.suffix == ".safetensors" else _optimizer_tensors(f)
        if not all(torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point()):
            return False
    return True


def _optimizer_tensors(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)["state"]
    return {f"{k}.{name}": v for k, s in state.items() for name, v in s.items() if torch.is_tensor(v)}


def run_with(tmp_path: Path, name: str, spec: str, capfd) -> tuple[int, Path, str]:
    config = make_config(tmp_path, "pretrain", name=f"{name}.yaml",
                         checkpointing={"every_steps": 2, "keep_last": 20}, schedule={"max_steps": STEPS})
    run_dir = tmp_path / name
    capfd.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.ENV, spec)
        code = main(["train", str(config), "--out", str(run_dir), "--quiet"])
    return code, run_dir, capfd.readouterr().err


def nan_steps(seed: int) -> list[int]:
    """One or two NaN-gradient steps, at random, never two in a row (a streak is the fallback's
    case: tests/train/test_recovery.py)."""
    rng = random.Random(seed)
    first = rng.randint(1, STEPS - 1)
    more = [s for s in range(1, STEPS + 1) if abs(s - first) > 1]
    return sorted([first] + ([rng.choice(more)] if rng.random() < 0.5 else []))


def check_run(tmp_path: Path, seed: int, capfd) -> None:
    steps = nan_steps(seed)
    code, run_dir, err = run_with(tmp_path, f"run{seed}", ",".join(f"nangrad@{s}" for s in steps), capfd)
    assert code == 0, err[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["global_step"] == STEPS
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    skipped = [r["step"] for r in recs if r.get("event") == "nonfinite_gradient"]
    assert skipped == steps, (seed, steps, skipped)
    assert not [r for r in recs if r.get("event") in ("nonfinite_loss", "precision_fallback")]
    losses = {r["step"]: r["loss"] for r in recs if "event" not in r and "loss" in r}
    assert all(math.isfinite(v) for v in losses.values())  # the weights were never poisoned
    for name, files in checkpoint_tensors(run_dir).items():
        assert all_finite(files), (seed, name)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_nan_gradients_with_a_finite_loss_are_skipped(tmp_path, seed, capfd):
    check_run(tmp_path, seed, capfd)


@pytest.mark.slow
def test_twenty_runs_with_nan_gradients_never_checkpoint_a_nonfinite_state(tmp_path, capfd):
    for seed in range(100, 120):
        check_run(tmp_path, seed, capfd)


def test_a_state_with_nonfinite_parameters_is_never_checkpointed(tmp_path, capfd):
    """Recovery off: nothing skips the NaN update; the poisoned steps are trained, logged with a
    NaN loss (not 0.0, not the previous average), and none of their states is written."""
    config = make_config(tmp_path, "pretrain", checkpointing={"every_steps": 2, "keep_last": 20},
                         schedule={"max_steps": 8})
    from trainfit.config.run_config import load_run_config
    from trainfit.train.runner import run_training

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.ENV, "nangrad@5")
        messages: list[str] = []
        result = run_training(load_run_config(config), tmp_path / "run", quiet=True, recover=False,
                              log=messages.append)
    assert result.global_step == 8
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("checkpoint-*"))
    assert names == ["checkpoint-2", "checkpoint-4"]  # 6 and 8 hold NaN weights: refused
    assert any("not checkpointing step 6: its parameters are not finite" in m for m in messages)
    losses = dict(result.losses)
    assert all(math.isfinite(losses[s]) for s in range(1, 6)) and all(math.isnan(losses[s]) for s in (6, 7, 8))
    from trainfit.report.run_data import load_run
    from trainfit.report.summary import summarize

    report = summarize(load_run(tmp_path / "run"))
    assert report["loss"]["non_finite_steps"] == 3 and report["loss"]["min"] > 1.0


def test_non_finite_guard_for_any_trainer(tmp_path):
    """NonFiniteGuard, for a Transformers Trainer outside `trainfit train`: the NaN-gradient
    update is skipped, the weights stay finite, the Trainer's own checkpoints are finite."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from trainfit.train.monitor.run_policies import NonFiniteGuard

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def forward(self, x, y):
            return {"loss": ((self.lin(x).squeeze(-1) - y) ** 2).mean()}

    class PoisonStep3(TrainerCallback):  # runs before the guard: NaN gradients, as an overflow makes them
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            if state.global_step + 1 == 3:
                for p in model.parameters():
                    p.grad.fill_(float("nan"))

    said: list[str] = []
    guard = NonFiniteGuard(log=said.append)
    data = [{"x": torch.randn(4), "y": torch.randn(())} for _ in range(32)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=4,
                             save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True, max_grad_norm=0.0)
    trainer = Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=[PoisonStep3(), guard])
    trainer.train()
    assert guard.skipped == [3] and any("update skipped" in m for m in said)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    for ckpt in sorted((tmp_path / "out").glob("checkpoint-*")):
        assert all_finite(sorted(ckpt.glob("*.safetensors")))
