"""FSDP (the ZeRO-3 equivalent) across 2 CPU processes with gloo, accumulating 2 micro-batches
(reduce-scatter after each: sync_each_batch): it trains, checkpoints, and a
run interrupted and resumed ends on the same loss as an uninterrupted one."""

from __future__ import annotations

import json
import os

import pytest

from .conftest import make_config, run_torchrun

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.mark.slow
def test_fsdp_full_shard_resumes_exactly(tmp_path):
    cfg = make_config(tmp_path, "pretrain", training={"micro_batch": 1, "grad_accum": 2, "zero_stage": 3,
                                                       "num_gpus": 2},
                      schedule={"max_steps": 6}, checkpointing={"every_steps": 3, "keep_last": 2},
                      distributed={"strategy": "fsdp"})

    def train(out: str, *extra: str) -> dict:
        rc, stdout, stderr = run_torchrun(["-m", "trainfit", "train", str(cfg), "--out", str(tmp_path / out),
                                           "--quiet", "--json", *extra], ENV)
        assert rc == 0, stderr[-3000:]
        assert "deprecated" not in stderr.lower(), stderr[-3000:]  # FSDP2 arguments, not the legacy string
        return json.loads(stdout)

    full = train("full")
    assert full["processes"] == 2 and full["global_step"] == 6 and full["final_loss"] < full["first_loss"]
    train("split", "--max-steps", "3")
    assert (tmp_path / "split" / "checkpoints" / "checkpoint-3").is_dir()
    resumed = train("split", "--resume")
    assert resumed["resumed_from"] == "checkpoint-3" and resumed["global_step"] == 6
    assert resumed["final_loss"] == full["final_loss"]
