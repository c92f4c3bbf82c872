"""Two processes (torchrun, gloo on CPU) finish with the same global batch and the same losses as
one process with doubled gradient accumulation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from trainfit.train.run_config import load_run_config
from trainfit.train.runner import run_training

from .conftest import make_config


def test_two_gloo_processes_match_one_with_double_accumulation(tmp_path):
    two = make_config(tmp_path, "pretrain", name="two.yaml", training={"micro_batch": 2, "grad_accum": 1},
                      schedule={"max_steps": 5}, checkpointing={"every_steps": 5})
    one = make_config(tmp_path, "pretrain", name="one.yaml", training={"micro_batch": 2, "grad_accum": 2},
                      schedule={"max_steps": 5}, checkpointing={"every_steps": 5})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    returncode, stdout, stderr = _run_group(
        torchrun + ["-m", "trainfit", "train", str(two), "--out", str(tmp_path / "ddp"), "--quiet", "--json"], env)
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


def _run_group(cmd: list[str], env: dict[str, str], timeout_s: float = 240) -> tuple[int, str, str]:
    """Run torchrun in its own process group; on timeout kill the whole group (workers too),
    so that a hung collective cannot leave orphan processes behind."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"torchrun timed out after {timeout_s} s: {stderr[-3000:]}") from None
    return proc.returncode, stdout, stderr
