"""The last steps of recovery, through `trainfit train` on CPU: 16-bit autocast when even the
smallest split runs out of memory ("AMP fallback on OOM"), a larger accumulation when fp32 still
gives non-finite steps ("gradient accumulation adjustment for stability"), and exit code 5 with
a clear message when the run has diverged past both."""

from __future__ import annotations

import json

import pytest

from trainfit.cli.main import main
from trainfit.errors import EXIT_DIVERGED
from trainfit.train.recovery import faults
from trainfit.train.recovery.precision import memory_precision

from .conftest import make_config


def events(run_dir, kind: str) -> list[dict]:
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get("event") == kind]


def train(config, run_dir, spec: str, capfd) -> tuple[int, str]:
    capfd.readouterr()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(faults.ENV, spec)
        code = main(["train", str(config), "--out", str(run_dir), "--quiet"])
    return code, capfd.readouterr().err


def test_memory_precision_step_down_rules():
    assert memory_precision("fp32", ("fp32", "bf16-mixed", "bf16"), "cpu") == "bf16-mixed"
    assert memory_precision("fp32", ("fp32", "fp16-mixed"), "cuda") == "fp16-mixed"  # e.g. a T4: no bf16
    assert memory_precision("fp32", ("fp32", "fp16-mixed"), "cpu") is None  # fp16 does not train on CPU
    assert memory_precision("bf16-mixed", None, "cuda") is None  # 16-bit already


def test_out_of_memory_at_the_smallest_split_steps_down_to_16_bit(tmp_path, capfd):
    """micro-batch 1 x 2: the first OOM turns on gradient checkpointing, the second (same step)
    finds nothing smaller, so the run goes on in bf16 autocast instead of stopping (exit 3)."""
    config = make_config(tmp_path, "pretrain", training={"micro_batch": 1, "grad_accum": 2},
                         schedule={"max_steps": 6})
    code, err = train(config, tmp_path / "run", "oom@4:cpu*2", capfd)
    assert code == 0, err[-2000:]
    (amp,) = events(tmp_path / "run", "amp_fallback")
    assert amp["from"]["precision"] == "fp32" and amp["to"]["precision"] == "bf16-mixed"
    assert amp["to"]["grad_checkpointing"] == "full" and amp["global_batch"] == 2
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_step"] == 6 and summary["training"]["precision"] == "bf16-mixed"
    adj = json.loads((tmp_path / "run" / "adjustments.json").read_text())
    assert adj["training"]["precision"] == "bf16-mixed"  # a --resume keeps it
    assert "precision fp32 -> bf16-mixed" in err
    assert "ETA" in err  # the log lines (no terminal) carry it


def test_nonfinite_streak_in_fp32_raises_the_accumulation_then_exits_5(tmp_path, capfd):
    """fp32 has no precision to fall back to: three NaN steps in a row double the accumulation
    (a larger effective batch) from the last good step; a second streak is divergence: exit 5,
    one clear line, the last good checkpoint kept."""
    config = make_config(tmp_path, "pretrain", schedule={"max_steps": 12})
    code, err = train(config, tmp_path / "run", "nan@6-8", capfd)
    assert code == 0, err[-2000:]
    (raised,) = events(tmp_path / "run", "accumulation_raised")
    assert raised["step"] == 5 and raised["from"]["grad_accum"] == 1 and raised["to"]["grad_accum"] == 2
    assert raised["global_batch"] == 8 and raised["continued_from"] == "checkpoint-5"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["global_step"] == 12 and summary["global_batch"] == 8

    code, err = train(config, tmp_path / "run2", "nan@3-5,nan@8-10", capfd)
    assert code == EXIT_DIVERGED == 5
    assert "training diverged" in err and "Traceback" not in err and "the last good state is checkpoint-" in err
    assert events(tmp_path / "run2", "accumulation_raised")
