"""Two processes (torchrun, gloo on CPU) finish with the same global batch and the same losses as
one process with doubled gradient accumulation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainfit.config.run_config import load_run_config
from trainfit.train.runner import run_training

from .conftest import make_config, run_torchrun


@pytest.mark.slow
def test_two_gloo_processes_match_one_with_double_accumulation(tmp_path):
    two = make_config(tmp_path, "pretrain", name="two.yaml", training={"micro_batch": 2, "grad_accum": 1},
                      schedule={"max_steps": 5}, checkpointing={"every_steps": 5})
    one = make_config(tmp_path, "pretrain", name="one.yaml", training={"micro_batch": 2, "grad_accum": 2},
                      schedule={"max_steps": 5}, checkpointing={"every_steps": 5})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    returncode, stdout, stderr = run_torchrun(
        ["-m", "trainfit", "train", str(two), "--out", str(tmp_path / "ddp"), "--quiet", "--json"], env)
    assert returncode == 0, stderr[-3000:]
    summary = json.loads(stdout)  # only rank 0 prints the summary
    assert summary["processes"] == 2 and summary["global_batch"] == 4 and summary["global_step"] == 5
    single = run_training(load_run_config(one), tmp_path / "single", quiet=True)
    assert single.summary["global_batch"] == 4
    ddp = [json.loads(line) for line in Path(tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    ddp_losses = [r["loss"] for r in ddp if "loss" in r]
    single_losses = [loss for _, loss in single.losses]
    assert len(ddp_losses) == len(single_losses) == 5
    for a, b in zip(ddp_losses, single_losses):
        assert abs(a - b) <= 1e-5 * abs(b), (ddp_losses, single_losses)

